"""The trial watchdog: a SIGALRM backstop behind the runner's own deadlines."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from tuner.errors import TrialTimeout

#: the watchdog fires this long after budget.trial_timeout: the runner's own deadline comes first,
#: and stopping the server after it needs time of its own
WATCHDOG_GRACE_S = 60.0


@contextlib.contextmanager
def watchdog(seconds: float, phase: Callable[[], str]) -> Iterator[None]:
    """Raise TrialTimeout in this thread if the block outlives `seconds`.

    A backstop behind the runner's deadlines, for a wait that ignores them (a read that hangs
    below a timeout, a library without one). Only the main thread receives SIGALRM, so elsewhere
    (a library caller's thread) the block runs unguarded.
    """
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise TrialTimeout(f"budget.trial_timeout passed during {phase()} (watchdog)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
