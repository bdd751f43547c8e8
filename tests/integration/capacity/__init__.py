"""Integration tests of tuner/capacity/."""
