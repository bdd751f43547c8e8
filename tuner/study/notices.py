"""Once-a-run warnings read off a trial's measurement, said as `tuner tune` goes, so a study
file that measures the wrong thing is fixed after its first trial, not read about at dawn:
a window that measured its ramp-up (loadgen/window.py), a request list that ran out before the
window's end (loadgen.plan.short_list_problem), and p99s read over too few requests to have a
tail (verdict.tails.thin_tails)."""

from __future__ import annotations

from collections.abc import Callable

from optuna.trial import FrozenTrial

from tuner.config.schema import StudyConfig
from tuner.loadgen.plan import longer_run
from tuner.loadgen.window import short_window
from tuner.outcome import Attr, full_params
from tuner.verdict.tails import thin_notes, thin_tails


def trial_notices(
    cfg: StudyConfig,
    say: Callable[[str], None],
    then: Callable[[FrozenTrial], None] | None = None,
) -> Callable[[FrozenTrial], None]:
    """A per-trial hook that says each warning once a run (`say`), then calls `then`."""
    said: set[str] = set()

    def once(kind: str, text: str) -> None:
        if kind not in said:
            said.add(kind)
            say(f"warning: {text}")

    def on_trial(t: FrozenTrial) -> None:
        metrics = t.user_attrs.get(Attr.METRICS) or {}
        concurrency = full_params(t.params, t.user_attrs).get("concurrency")
        if (note := short_window(cfg.workload.duration_s, metrics, concurrency)) is not None:
            once("window", note)
        if metrics.get("exhausted"):
            once(
                "exhausted",
                f"trial {t.number}'s load run sent its whole request list in "
                f"{float(metrics.get('duration', 0)):.1f} s of its {cfg.workload.duration_s:g} s "
                f"window (exhausted): kind {cfg.workload.kind}'s list is finite; its "
                "runs measure a shorter window",
            )
        if tails := t.user_attrs.get(Attr.TAILS):
            for note in thin_notes(
                thin_tails([tails]), longer_run(cfg.workload), f"trial {t.number}'s run"
            ):
                once("thin", note)
        if then is not None:
            then(t)

    return on_trial
