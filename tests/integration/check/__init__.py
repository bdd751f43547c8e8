"""Integration tests of tuner/check/."""
