"""Unit tests of tuner/study/."""
