"""Follow a starting server's log on its host and report SGLang's start-up milestones.

`StartupLog` is the lifecycle's `on_poll` hook (`server.lifecycle.Server.on_poll`): at each readiness
poll it reads only the bytes the log gained since the last read (one short shell command on the
host, at most every `min_interval_s`), and reports each milestone of `sglang.milestones` once per
start. A read that fails costs nothing but the milestone: readiness is the lifecycle's business.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from typing import Any

from tuner.errors import InfraError
from tuner.sglang.milestones import Milestone, milestones

log = logging.getLogger(__name__)

#: the most bytes one poll reads (a start-up log is far smaller; a flood waits for the next poll)
MAX_READ_BYTES = 256 * 1024
#: a read answers within this (the host's own command deadline is longer)
READ_TIMEOUT_S = 10.0


def read_script(path: str, offset: int, limit: int) -> str:
    """Print `<size> <n>` on the first line, then the `n` (at most `limit`) bytes from
    `offset` on: the count comes from the host, not from text decoded here."""
    q = shlex.quote(path)
    return (
        f"s=$(wc -c < {q} 2>/dev/null) || exit 0; n=$((s - {int(offset)})); "
        f"[ $n -gt {int(limit)} ] && n={int(limit)}; [ $n -lt 0 ] && n=0; echo $s $n; "
        f"[ $n -gt 0 ] && tail -c +{int(offset) + 1} -- {q} | head -c $n; exit 0"
    )


class StartupLog:
    """Call it at each readiness poll of `server` (which has `pgid` and `log_path`)."""

    def __init__(
        self,
        server: Any,
        host: Any,
        emit: Callable[[Milestone], None],
        *,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.server = server
        self.host = host
        self.emit = emit
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._start: tuple[Any, Any] | None = None
        self._offset = 0
        self._partial = ""
        self._seen: set[str] = set()
        self._last = -float("inf")

    def __call__(self, last: bool = False) -> None:
        """`last`: the start just ended (ready or dead): read what the log gained whatever the
        interval, or a start quicker than `min_interval_s` would report none of its milestones."""
        start = (self.server.pgid, self.server.log_path)
        if start != self._start:  # a new start: its own log, its own milestones
            self._start, self._offset, self._partial, self._seen = start, 0, "", set()
            self._last = -float("inf")
        if start[1] is None or (not last and self.clock() - self._last < self.min_interval_s):
            return
        self._last = self.clock()
        try:
            res = self.host.run_shell(
                read_script(start[1], self._offset, MAX_READ_BYTES), timeout=READ_TIMEOUT_S
            )
        except InfraError as exc:
            log.debug("cannot read %s: %s", start[1], exc)
            return
        self._take(res.stdout if res.ok else "")

    def _take(self, out: str) -> None:
        head, _, text = out.partition("\n")
        counts = head.split()
        if len(counts) != 2 or not all(c.isdigit() for c in counts):
            return
        if int(counts[0]) < self._offset:  # the log was truncated: a new file under the name
            self._offset, self._partial = 0, ""
            return
        self._offset += int(counts[1])
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # an unfinished line waits for the rest
        for m in milestones(lines):
            if m.key not in self._seen:
                self._seen.add(m.key)
                self.emit(m)
