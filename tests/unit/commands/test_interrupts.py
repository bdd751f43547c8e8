"""`tuner tune`'s Ctrl-C/SIGTERM handler in a real process: an interrupt that Python swallowed
(raised inside a finalizer) is delivered again instead of being lost."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.studies import REPO

SWALLOWED = """
import os, signal, sys, time
from tuner.commands.tune import interrupts

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs in here: its raise is swallowed
        time.sleep(0.01)

with interrupts():
    try:
        Finalized()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            time.sleep(0.01)
        sys.exit(3)  # the run went on: the interrupt was lost
    except KeyboardInterrupt:
        sys.exit(130)
"""


def test_an_interrupt_swallowed_by_a_finalizer_is_delivered_again() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert out.returncode == 130, out.stderr
    assert out.stderr.count("stopping after cleanup") == 1  # announced once, as one press
    assert "Exception ignored" not in out.stderr
