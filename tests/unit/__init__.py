"""Unit tests: pure logic, fakes and scripted seams; a folder per package of tuner/."""
