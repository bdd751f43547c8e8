"""Unit tests of tuner/config/."""
