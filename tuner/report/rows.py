"""One row per trial: what `tuner status` (table, `--wide`, `--json`) and `tuner export --format
csv` show. Reads only; no optuna writes.

Rows read the record every tuner version wrote (the `metrics` JSON, `server_info`), so studies
written before the numeric metric attributes read the same. Only a measured run has figures: a
configuration that died, failed to start or was rejected shows why, never a zero latency.
Parameter values are written as the user would (`search.space.tidy`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from rich import box
from rich.table import Table
from rich.text import Text

from tuner.config.schema import StudyConfig
from tuner.outcome import METRIC_ATTRS, POOL_ATTR, Attr, Status, full_params, is_feasible, score_of
from tuner.search.space import tidy_params
from tuner.verdict.winner import best_trial

#: the run's figures a row carries (None unless the trial was measured): the trial record's own
FIGURES = METRIC_ATTRS
#: short names of common flags in the narrow table (`--wide` and JSON keep the full ones)
SHORT = {
    "mem-fraction-static": "mfs",
    "hicache-size": "hicache",
    "concurrency": "conc",
    "schedule-conservativeness": "conserv",
    "chunked-prefill-size": "chunk",
    "cuda-graph-max-bs": "graph-bs",
    "hicache-write-policy": "policy",
    "max-running-requests": "max-run",
    "schedule-policy": "sched",
    "request-rate": "rate",
}
#: `--wide` wraps a reason at this many columns
WIDE_REASON = 60
_STATE_WORDS = {"FAIL": "failed", "RUNNING": "running", "WAITING": "waiting", "PRUNED": "pruned"}


def metric_unit(metric: str) -> str:
    """The unit of an objective metric's value."""
    return "req/s" if metric in ("request_throughput", "goodput") else "tok/s"


def trial_rows(cfg: StudyConfig, study: optuna.Study) -> list[dict[str, Any]]:
    """One dict per trial, in trial order (`tuner status --json`'s `trials`)."""
    best, _ = best_trial(study)
    pool: Any = None  # the KV pool of the last server a trial started (reused ones share it)
    rows = []
    trials = study.get_trials(deepcopy=False)
    # a trial stopped mid-way (Ctrl-C, a kill) records nothing itself: its re-queued try says
    again = {t.user_attrs.get(Attr.RETRY_OF): t.number for t in trials}
    for t in trials:
        a = t.user_attrs
        status = a.get(Attr.STATUS) or ""
        measured = status in (Status.OK, Status.SLO_MISSED)
        m = a.get(Attr.METRICS) or {}
        started = (a.get(Attr.SERVER_INFO) or {}).get(POOL_ATTR)
        if started is not None:
            pool = started
        # inner mode: the concurrency the trial's search chose, as if it had been sampled
        raw = full_params(dict(t.params) or dict(t.system_attrs.get("fixed_params") or {}), a)
        reason = a.get(Attr.REASON) or a.get(Attr.INFRA_ERROR) or ""
        if not reason and t.state.name == "FAIL":
            retry = again.get(t.number)
            reason = "stopped before it ended (interrupted or killed)" + (
                f"; its params ran again as #{retry}" if retry is not None else ""
            )
        if a.get(Attr.DUPLICATE_OF) is not None:
            reason = f"same config as #{a[Attr.DUPLICATE_OF]}" + (f": {reason}" if reason else "")
        complete = t.state.name == "COMPLETE"
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "status": status,
                "best": best is not None and t.number == best.number,
                "params": tidy_params(raw, t.distributions),
                "feasible": is_feasible(t.constraints) if complete else None,
                "value": t.values[0] if t.values else None,
                "score": score_of(cfg.objective.metric, m) if measured else None,
                **{k: (_num(m.get(k)) if measured else None) for k in FIGURES},
                POOL_ATTR: _pool(a, started, pool if measured else None),
                "reason": reason,
                "failure": a.get(Attr.FAILURE),
                "restarted": a.get(Attr.RESTARTED),
                "duplicate_of": a.get(Attr.DUPLICATE_OF),
                "worker": a.get(Attr.WORKER),
            }
        )
    return rows


def _pool(attrs: Mapping[str, Any], started: Any, reused: Any) -> Any:
    """The KV pool a trial ran with: recorded, or of the server it started, or (measured on a
    reused server) of the last one started; none for a server that never came up."""
    if attrs.get(POOL_ATTR) is not None:
        return attrs[POOL_ATTR]
    if started is not None:
        return started
    return None if attrs.get(Attr.RESTARTED) else reused


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def status_word(row: Mapping[str, Any]) -> str:
    """`best` for the winner, else the outcome's status, else optuna's state in words."""
    if row["best"]:
        return "best"
    return row["status"] or _STATE_WORDS.get(row["state"], row["state"].lower())


def param_text(params: Mapping[str, Any], short: bool = True) -> str:
    """`mfs=0.87 conc=64` (full flag names when not `short`)."""
    names = SHORT if short else {}
    return " ".join(f"{names.get(k, k)}={_text(v)}" for k, v in params.items())


def _params_cell(params: Mapping[str, Any], wide: bool) -> str:
    return "\n".join(f"{k}={_text(v)}" for k, v in params.items()) if wide else param_text(params)


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


# --- the table ------------------------------------------------------------------------------


def trials_table(
    cfg: StudyConfig, rows: Sequence[Mapping[str, Any]], width: int, wide: bool = False
) -> Table:
    """The trials as a rich table that fits `width` columns, one line per trial: params and
    reason are cut with an ellipsis. `wide`: every figure and the whole text, wrapped."""
    metric = cfg.objective.metric
    unit = metric_unit(metric)
    spec = ",.2f" if unit == "req/s" else ",.0f"
    columns: list[tuple[str, str, list[str]]] = [
        ("#", "right", [str(r["trial"]) for r in rows]),
        ("status", "left", [status_word(r) for r in rows]),
        ("params", "left", [_params_cell(r["params"], wide) for r in rows]),
        (unit, "right", [_fmt(r["score"], spec) for r in rows]),
        ("p99 TTFT ms", "right", [_fmt(r["p99_ttft_ms"], ",.0f") for r in rows]),
    ]
    if wide:
        columns += [
            ("bench tok/s", "right", [_fmt(r["output_throughput"], ",.0f") for r in rows]),
            ("req/s", "right", [_fmt(r["request_throughput"], ",.2f") for r in rows]),
            ("p99 TPOT ms", "right", [_fmt(r["p99_tpot_ms"], ",.1f") for r in rows]),
            ("p99 ITL ms", "right", [_fmt(r["p99_itl_ms"], ",.1f") for r in rows]),
            ("errors", "right", [_fmt(r["error_rate"], ".1%") for r in rows]),
            ("pool tokens", "right", [_fmt(r[POOL_ATTR], ",") for r in rows]),
            ("worker", "left", [str(r["worker"] or "") for r in rows]),
        ]
    columns.append(("reason", "left", [str(r["reason"]) for r in rows]))
    title = f"study {cfg.study}: {metric} ({unit})"
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    widths = None if wide else _fit(columns, width)
    for i, (name, justify, cells) in enumerate(columns):
        # wide: one param a line, never cut; the reason wraps
        whole = wide and name != "reason"
        table.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=not wide or whole,
            overflow="fold" if wide else "ellipsis",
            width=None if widths is None else widths[i],
            min_width=max(len(line) for c in [name, *cells] for line in c.split("\n"))
            if whole
            else None,
            max_width=WIDE_REASON if wide and not whole else None,
        )
    for i, r in enumerate(rows):
        style = "bold green" if r["best"] else None
        # Text, not str: a reason such as "[Errno 111]" is not rich markup
        table.add_row(*(Text(cells[i]) for _, _, cells in columns), style=style)
    return table


def table_width(table: Table) -> int:
    """The columns `table` needs to show every cell whole (its reasons wrapped)."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=10_000)
    return Measurement.get(console, console.options, table).maximum


def _fit(columns: Sequence[tuple[str, str, list[str]]], width: int) -> list[int]:
    """Column widths within `width`: the figures whole, params and reason share the rest."""
    natural = [max([len(name), *(len(c) for c in cells)]) for name, _, cells in columns]
    gaps = 3 * (len(columns) - 1)  # padding (0, 1) and a separator between columns, no edges
    params, reason = 2, len(columns) - 1
    rest = width - gaps - sum(w for i, w in enumerate(natural) if i not in (params, reason))
    want_p, want_r = natural[params], natural[reason]
    if want_p + want_r > rest:
        # params first (they say what was tried), but the reason keeps a readable start
        want_p = min(want_p, max(rest - want_r, rest * 3 // 5, 8))
        want_r = max(rest - want_p, 6)
    widths = list(natural)
    widths[params], widths[reason] = max(want_p, len("params")), max(want_r, len("reason"))
    return widths


# --- CSV --------------------------------------------------------------------------------------

#: the CSV's columns before and after the params (one column per parameter)
CSV_HEAD = ("trial", "state", "status", "feasible", "best", "value")
CSV_TAIL = (*FIGURES, POOL_ATTR, "reason", "failure", "duplicate_of", "restarted", "worker")


def trials_csv(cfg: StudyConfig, rows: Sequence[Mapping[str, Any]]) -> str:
    """Every trial as CSV (RFC 4180: a header row, quoted where needed, CRLF line ends)."""
    names = list(cfg.space)
    for r in rows:  # a parameter the space no longer names (a resumed old study) still shows
        names += [k for k in r["params"] if k not in names]
    out = io.StringIO()
    writer = csv.writer(out)  # the excel dialect is RFC 4180's
    writer.writerow([*CSV_HEAD, *names, *CSV_TAIL])
    for r in rows:
        writer.writerow(
            [
                *(_cell(r[k]) for k in CSV_HEAD),
                *(_cell(r["params"].get(n), exact=True) for n in names),
                *(_cell(r[k]) for k in CSV_TAIL),
            ]
        )
    return out.getvalue()


def _cell(v: Any, exact: bool = False) -> Any:
    """None as an empty cell; a measured float to 6 significant digits (2512.34, 0.00123457),
    a parameter (`exact`) as tidied: it is a configuration someone may run again."""
    if v is None:
        return ""
    if isinstance(v, float) and not exact:
        return repr(float(f"{v:.6g}"))
    return v
