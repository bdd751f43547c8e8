"""Network helpers for tests (loopback only)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port the kernel just handed out on 127.0.0.1 (bind to port 0).

    Free a moment ago, not reserved: a caller that binds later retries or fails visibly.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
