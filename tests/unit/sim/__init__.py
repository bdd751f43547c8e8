"""Unit tests of tuner/sim/."""
