"""Integration tests of tuner/loadgen/."""
