"""The displays of a running study: a rich live panel on a terminal, plain lines elsewhere.

Both take the same calls (`api.Events`' hooks): `progress(event)`, `trial(frozen_trial)`,
`message(text)`, and are context managers around the run.

- `LiveDisplay` (stderr is a terminal): a panel redrawn four times a second from
  `watch.state.StudyWatch` (trial i of N and of the time budget, elapsed, ETA, best so far, counts,
  the phase with its own clock, the server's start-up milestones, the load run's bar with
  tok/s and the server's running/queued requests); finished trials and messages print above it.
- `PlainLines` (not a terminal, or `--no-progress`): one line per event, each starting with a
  local ISO timestamp, a unit on every number, no trailing spaces; the load run's progress at
  most every `PLAIN_LOAD_EVERY_S`. Greppable: `grep ' trial #12 '`, `grep ' progress '`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from optuna.trial import FrozenTrial
from rich.console import Console, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tuner.config.schema import StudyConfig
from tuner.watch.events import (
    PHASE_NAMES,
    LoadProgress,
    Milestone,
    PhaseChanged,
    ProgressEvent,
    RunStarted,
    TrialStarted,
    duration,
    metric_unit,
    param_text,
    trial_line,
)
from tuner.watch.state import StudyWatch, View

#: plain mode prints the load run's progress at most this often (a line a second is noise)
PLAIN_LOAD_EVERY_S = 5.0


# --- words shared by both displays --------------------------------------------------------


def budget_text(v: View) -> str:
    """`trial 4/10, 1m 12s elapsed of a 10m 00s budget, ETA 2m 30s`."""
    if not v.n_trials:
        return f"preparing (the host's checks, the study), {duration(v.elapsed_s)} elapsed"
    head = f"trial {v.index}/{v.n_trials}"
    if v.confirm:
        head = f"confirmation run {v.confirm}/{v.confirms}"
    budget = f" of a {duration(v.timeout_s)} budget" if v.timeout_s else ""
    eta = duration(v.eta_s) if v.eta_s is not None else "after the first trial"
    return f"{head}, {duration(v.elapsed_s)} elapsed{budget}, ETA {eta}"


def best_text(v: View) -> str:
    if v.best is None:
        return "no feasible trial yet"
    b = v.best
    return (
        f"{b.value:,.1f} {metric_unit(v.metric)} {v.metric} at trial #{b.number} "
        f"({param_text(b.params)})"
    )


def counts_text(v: View, sep: str = ", ") -> str:
    c = v.counts
    why = ", ".join(f"{n} {k}" for k, n in c.reasons)
    infeasible = f"{c.infeasible} infeasible" + (f" ({why})" if why else "")
    return sep.join(
        (
            f"{c.complete} complete: {c.feasible} feasible",
            infeasible,
            f"{c.rejected} rejected before launch",
            f"{c.failed} failed",
            f"{c.server_reuses} server reuses",
            f"{c.duplicates} duplicates",
        )
    )


def load_text(p: LoadProgress) -> str:
    """`2.0 s of 6.0 s, 40 requests done, 2,345.1 tok/s, 64 running, 12 queued`."""
    window = f" of {duration(p.window_s)}" if p.window_s else ""
    parts = [f"{duration(p.elapsed_s)}{window}", f"{p.done:,} requests done"]
    parts.append(f"{p.tok_s:,.1f} tok/s")
    if p.running is not None:
        parts.append(f"{p.running:,.0f} running")
    if p.queued is not None:
        parts.append(f"{p.queued:,.0f} queued")
    return ", ".join(parts)


def phase_name(phase: str | None) -> str:
    return PHASE_NAMES.get(phase or "", phase or "between trials")


# --- the rich panel -----------------------------------------------------------------------


def render(v: View) -> RenderableType:
    """One frame of the live panel (pure: a `View` in, a rich renderable out)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("run", Text(budget_text(v)))
    grid.add_row("best", Text(best_text(v), style="green" if v.best else "dim"))
    grid.add_row("trials", Text(counts_text(v, " · ")))
    if v.trial is not None:
        what = f"trial #{v.trial}"
        if v.confirm:
            what = f"confirming trial #{v.trial} (run {v.confirm}/{v.confirms})"
        grid.add_row("now", Text(f"{what}: {param_text(v.params)}"))
    grid.add_row("phase", _phase_row(v))
    if v.milestones:
        grid.add_row("server", Text(" · ".join(v.milestones)))
    return Panel(grid, title=f"tuner tune {v.study}", title_align="left")


def _phase_row(v: View) -> RenderableType:
    clock = Text(f"{phase_name(v.phase)} {duration(v.phase_s)}", style="cyan")
    p = v.load
    if p is None:
        return clock
    total, done = (p.window_s, p.elapsed_s) if p.window_s else (p.planned, p.done)
    row = Table.grid(padding=(0, 1))
    row.add_row(
        clock,
        ProgressBar(total=max(total, 1e-9), completed=min(done, total), width=24),
        Text(load_text(p)),
    )
    return row


class LiveDisplay:
    """The live panel on `console` (a terminal); trials and messages print above it."""

    def __init__(
        self, cfg: StudyConfig, console: Console, clock: Callable[[], float] | None = None
    ):
        self.cfg = cfg
        self.console = console
        self.watch = StudyWatch(clock or time.monotonic)
        self._started: dict[int, float] = {}
        self.live = Live(
            console=console,
            get_renderable=lambda: render(self.watch.snapshot()),
            refresh_per_second=4,
            transient=True,
        )

    def __enter__(self) -> LiveDisplay:
        self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.stop()

    def progress(self, event: ProgressEvent) -> None:
        if isinstance(event, TrialStarted) and not event.confirm:
            self._started[event.number] = self.watch.clock()
        self.watch.take(event)

    def trial(self, t: FrozenTrial) -> None:
        self.watch.finished(t)
        took = _took(self._started.pop(t.number, None), self.watch.clock())
        self.console.print(trial_line(self.cfg, t) + took, highlight=False, markup=False)

    def message(self, text: str) -> None:
        # not markup: "[restart]" and a reason's brackets are text
        self.console.print(text, highlight=False, markup=False)


# --- plain lines --------------------------------------------------------------------------


def stamp(text: str, now: float | None = None) -> str:
    """`2026-01-02T03:04:05 text`, no trailing spaces."""
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
    return f"{ts} {text}".rstrip()


class PlainLines:
    """One plain, timestamped line per event, through `write` (e.g. to stderr)."""

    def __init__(
        self,
        cfg: StudyConfig,
        write: Callable[[str], None],
        clock: Callable[[], float] | None = None,
        prefix: str = "",
    ):
        self.cfg = cfg
        self.write = write
        self.prefix = prefix  # a fleet's worker: `gpu-a: ` after the timestamp
        self.watch = StudyWatch(clock or time.monotonic)
        self._started: dict[int, float] = {}
        self._last_load = -float("inf")

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _line(self, text: str) -> None:
        for part in text.splitlines() or [""]:
            if part.strip():
                self.write(stamp(self.prefix + part))

    def progress(self, event: ProgressEvent) -> None:
        before, took = self.watch.phase_elapsed()
        self.watch.take(event)
        v = self.watch.snapshot()
        n = f"trial #{v.trial}" if v.trial is not None else "server"
        if isinstance(event, RunStarted):
            budget = f", time budget {duration(v.timeout_s)}" if v.timeout_s else ""
            self._line(f"study {v.study}: {v.counts.complete}/{v.n_trials} trials complete{budget}")
        elif isinstance(event, TrialStarted):
            self._started.setdefault(event.number, self.watch.clock())
            if event.confirm:
                what = f"confirmation run {event.confirm}/{event.confirms} started"
            else:
                what = f"started ({v.index}/{v.n_trials} trials)"
            self._line(f"trial #{event.number} {what}: {param_text(event.params)}")
        elif isinstance(event, PhaseChanged):
            after = f" ({phase_name(before)} took {duration(took)})" if before else ""
            self._line(f"trial #{event.number} phase {phase_name(event.phase)}{after}")
        elif isinstance(event, Milestone):
            self._line(f"{n} server: {event.text}")
        elif isinstance(event, LoadProgress):
            now = self.watch.clock()
            if now - self._last_load >= PLAIN_LOAD_EVERY_S:
                self._last_load = now
                self._line(f"{n} load {load_text(event)}")

    def trial(self, t: FrozenTrial) -> None:
        self.watch.finished(t)
        took = _took(self._started.pop(t.number, None), self.watch.clock())
        self._line(trial_line(self.cfg, t) + took)
        v = self.watch.snapshot()
        eta = duration(v.eta_s) if v.eta_s is not None else "unknown"
        self._line(
            f"progress {v.counts.complete}/{v.n_trials} trials: {counts_text(v)}; "
            f"{duration(v.elapsed_s)} elapsed, ETA {eta}; best {best_text(v)}"
        )

    def message(self, text: str) -> None:
        self._line(text)


def _took(t0: float | None, now: float) -> str:
    return f" in {duration(now - t0)}" if t0 is not None else ""


def display_for(
    cfg: StudyConfig, console: Console, plain: bool, write: Callable[[str], None] | None = None
) -> LiveDisplay | PlainLines:
    """The live panel on a terminal, plain lines when asked (`--no-progress`) or piped."""
    if plain or not console.is_terminal:
        return PlainLines(cfg, write or (lambda line: console.file.write(line + "\n")))
    return LiveDisplay(cfg, console)
