"""Unit tests of tuner/loadgen/."""
