"""Unit tests of tuner/verdict/."""
