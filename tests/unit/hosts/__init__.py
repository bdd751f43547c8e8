"""Unit tests of tuner/hosts/."""
