"""Integration tests of tuner/server/."""
