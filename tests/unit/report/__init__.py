"""Unit tests of tuner/report/."""
