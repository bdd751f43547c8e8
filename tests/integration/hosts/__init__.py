"""Integration tests of tuner/hosts/."""
