"""Integration tests of tuner/config/."""
