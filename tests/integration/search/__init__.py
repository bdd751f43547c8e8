"""Integration tests of tuner/search/."""
