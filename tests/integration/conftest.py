"""Fixtures shared by the integration tests (others may add imports here)."""

from sshd import any_host, reaped_groups, sshd_server  # noqa: F401  (pytest finds fixtures by name)
