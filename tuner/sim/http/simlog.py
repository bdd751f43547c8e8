"""SGLang's log lines as the simulator writes them: timestamp, scheduler tag, flushed per line."""

from __future__ import annotations

import contextlib
import time
from typing import TextIO


class Log:
    """SGLang's log format on one stream: `[%Y-%m-%d %H:%M:%S TP0] text`, flushed per line.

    Under DP attention each group's scheduler writes its own lines as `DP<g> TP<t>`, t the
    group's first GPU (0.5.6.post2 managers/scheduler.py:2635-2645, 0.5.23 :6279-6290);
    start-up lines are group 0's.
    """

    def __init__(self, stream: TextIO, tp: int, dp_groups: int = 1):
        self.stream = stream
        self.tp = tp
        self.dp_groups = dp_groups
        self.tag = self._tag(0)

    def _tag(self, group: int) -> str:
        tp = f" TP{group * (self.tp // self.dp_groups)}" if self.tp > 1 else ""
        return f" DP{group}{tp}" if self.dp_groups > 1 else tp

    def __call__(
        self, text: str, scheduler: bool = False, raw: bool = False, group: int | None = None
    ) -> None:
        if raw:
            line = text
        else:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            tag = (self.tag if group is None else self._tag(group)) if scheduler else ""
            line = f"[{stamp}{tag}] {text}"
        with contextlib.suppress(ValueError, OSError):
            self.stream.write(line + "\n")
            self.stream.flush()
