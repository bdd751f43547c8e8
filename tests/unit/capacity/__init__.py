"""Unit tests of tuner/capacity/."""
