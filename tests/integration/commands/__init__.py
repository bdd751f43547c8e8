"""Integration tests of tuner/commands/."""
