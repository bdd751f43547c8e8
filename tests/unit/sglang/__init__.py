"""Unit tests of tuner/sglang/."""
