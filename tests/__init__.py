"""The test suite is a package so that tests and benchmarks import `tests.helpers` by name."""
