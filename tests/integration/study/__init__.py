"""Integration tests of tuner/study/."""
