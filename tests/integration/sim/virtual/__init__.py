"""Integration tests of tuner/sim/virtual/."""
