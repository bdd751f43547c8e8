"""Unit tests of tuner/sim/engine/."""
