"""Unit tests of tuner/trial/."""
