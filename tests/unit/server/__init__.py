"""Unit tests of tuner/server/."""
