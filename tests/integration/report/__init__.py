"""Integration tests of tuner/report/."""
