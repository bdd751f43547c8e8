"""Unit tests of tuner/sim/virtual/."""
