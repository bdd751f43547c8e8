"""Unit tests of tuner/watch/."""
