"""Unit tests of tuner/check/."""
