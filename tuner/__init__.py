"""tuner: find the SGLang launch flags that give the most throughput, by measurement."""

__version__ = "0.1.0"
