"""Unit tests of tuner/commands/."""
