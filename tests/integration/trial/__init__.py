"""Integration tests of tuner/trial/."""
