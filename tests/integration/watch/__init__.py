"""Integration tests of tuner/watch/."""
