"""The display of a fleet: every worker of one study on one screen.

Each worker's events fold into a `StudyWatch` of its own (its trial, phase, start-up, load run);
a trial any worker finishes is counted by every watch (`StudyWatch.counted`), so the counts,
the best and trial i of N are the study's. Both displays take the fleet's calls:
`progress(worker, event)`, `trial(worker, trial)`, `message(worker or None, text)`,
`ended(worker, text)`, and are context managers around the run.

- `FleetLive` (a terminal): the study's rows (run, best, trials) above one row per worker (its
  trial and params, phase with its clock, the load run or the server's start-up, or how it
  ended); finished trials and messages print above the panel, `gpu-a: ` in front.
- `FleetPlain` (not a terminal, or `--no-progress`): `PlainLines` per worker, each line
  `TIMESTAMP gpu-a: ...`; the fleet's own lines say `fleet: `.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from optuna.trial import FrozenTrial
from rich.console import Console, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tuner.config.schema import StudyConfig
from tuner.watch.events import (
    ProgressEvent,
    RunStarted,
    TrialStarted,
    duration,
    param_text,
    trial_line,
)
from tuner.watch.live import (
    PlainLines,
    best_text,
    budget_text,
    counts_text,
    load_text,
    phase_name,
)
from tuner.watch.state import StudyWatch, View

#: the prefix of the fleet's own lines (a worker's are its name)
FLEET = "fleet"


def render_fleet(views: dict[str, View], ended: dict[str, str]) -> RenderableType:
    """One frame: the study's rows from the first begun worker's view (every watch counts
    every trial), then a row per worker. Pure."""
    first = next((v for v in views.values() if v.n_trials), next(iter(views.values())))
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("run", Text(budget_text(first)))
    grid.add_row("best", Text(best_text(first), style="green" if first.best else "dim"))
    grid.add_row("trials", Text(counts_text(first, " · ")))
    workers = Table(box=None, padding=(0, 1), show_edge=False)
    for name in ("worker", "now", "phase", "detail"):
        workers.add_column(name, overflow="fold")
    for worker, v in views.items():
        if worker in ended:
            workers.add_row(worker, Text(ended[worker], style="dim"), "", "")
            continue
        now = ""  # the phase column says "between trials"
        if v.trial is not None:
            now = f"trial #{v.trial}: {param_text(v.params)}"
            if v.confirm:
                now = f"confirming #{v.trial} ({v.confirm}/{v.confirms})"
        detail = load_text(v.load) if v.load else " · ".join(v.milestones)
        phase = Text(f"{phase_name(v.phase)} {duration(v.phase_s)}", style="cyan")
        workers.add_row(worker, now, phase, detail)
    grid.add_row("workers", workers)
    return Panel(grid, title=f"tuner tune {first.study} (fleet)", title_align="left")


class FleetLive:
    """The fleet's live panel on `console` (a terminal)."""

    def __init__(
        self,
        cfg: StudyConfig,
        workers: Sequence[str],
        console: Console,
        clock: Callable[[], float] | None = None,
    ):
        self.cfg = cfg
        self.console = console
        clock = clock or time.monotonic
        self.watches = {w: StudyWatch(clock) for w in workers}
        self.begun: set[str] = set()  # workers whose RunStarted came (it counts the study)
        self.endings: dict[str, str] = {}
        self._started: dict[int, float] = {}
        self.live = Live(
            console=console,
            get_renderable=lambda: render_fleet(
                {w: s.snapshot() for w, s in self.watches.items()}, dict(self.endings)
            ),
            refresh_per_second=4,
            transient=True,
        )

    def __enter__(self) -> FleetLive:
        self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.stop()

    def progress(self, worker: str, event: ProgressEvent) -> None:
        watch = self.watches[worker]
        if isinstance(event, TrialStarted) and not event.confirm:
            self._started[event.number] = watch.clock()
        if isinstance(event, RunStarted):
            self.begun.add(worker)
        watch.take(event)

    def trial(self, worker: str, t: FrozenTrial) -> None:
        for name, watch in self.watches.items():
            if name == worker:
                watch.finished(t)
            elif name in self.begun:  # else its RunStarted, read later, holds this trial
                watch.counted(t)
        t0 = self._started.pop(t.number, None)
        took = f" in {duration(self.watches[worker].clock() - t0)}" if t0 is not None else ""
        self.message(worker, trial_line(self.cfg, t) + took)

    def message(self, worker: str | None, text: str) -> None:
        for line in text.splitlines() or [""]:
            self.console.print(f"{worker or FLEET}: {line}", highlight=False, markup=False)

    def ended(self, worker: str, text: str) -> None:
        self.endings[worker] = text
        self.message(worker, text)


class FleetPlain:
    """One plain timestamped line per event, each naming its worker, through `write`."""

    def __init__(
        self,
        cfg: StudyConfig,
        workers: Sequence[str],
        write: Callable[[str], None],
        clock: Callable[[], float] | None = None,
    ):
        self.lines = {w: PlainLines(cfg, write, clock, prefix=f"{w}: ") for w in workers}
        self.fleet = PlainLines(cfg, write, clock, prefix=f"{FLEET}: ")
        self.begun: set[str] = set()  # workers whose RunStarted came (it counts the study)

    def __enter__(self) -> FleetPlain:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def progress(self, worker: str, event: ProgressEvent) -> None:
        if isinstance(event, RunStarted):
            self.begun.add(worker)
        self.lines[worker].progress(event)

    def trial(self, worker: str, t: FrozenTrial) -> None:
        for name, lines in self.lines.items():
            if name == worker:
                lines.trial(t)  # its line, and the study's progress after it
            elif name in self.begun:  # else its RunStarted, read later, holds this trial
                lines.watch.counted(t)

    def message(self, worker: str | None, text: str) -> None:
        (self.lines[worker] if worker else self.fleet).message(text)

    def ended(self, worker: str, text: str) -> None:
        self.message(worker, text)


def fleet_display_for(
    cfg: StudyConfig,
    workers: Sequence[str],
    console: Console,
    plain: bool,
    write: Callable[[str], None] | None = None,
) -> FleetLive | FleetPlain:
    """The live panel on a terminal, plain lines when asked (`--no-progress`) or piped."""
    if plain or not console.is_terminal:
        return FleetPlain(cfg, workers, write or (lambda line: console.file.write(line + "\n")))
    return FleetLive(cfg, workers, console)
