"""Unit tests of tuner/search/."""
