"""Integration tests of tuner/sim/http/."""
