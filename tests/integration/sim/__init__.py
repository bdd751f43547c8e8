"""Integration tests of tuner/sim/."""
