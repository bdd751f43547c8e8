"""A study's stored rows, checked when a command opens the study: a study.db edited by hand (a
value that is not JSON, a NULL objective, a trial state optuna does not know, one of tuner's
records of the wrong type) is one line naming the row and what it must hold, exit 2, before
anything reads the trials or writes a row.

Two layers. Optuna decodes every row as it loads the trials; where that raises (its json, enum
and assert checks), the rows are scanned with SQLite itself to name the one that failed
(`locate`; another database gets the error's own words). Then tuner's records are checked by
type (`TRIAL_TYPES`, `study_problem`): the keys tuner reads without a guard, to the depth it
reads them. A record's inner fields (a load point's keys, a metric inside `metrics`) are not
checked: tuner reads those with `.get` and defaults.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import InputFileError
from tuner.outcome import METRIC_ATTRS, POOL_ATTR, Attr
from tuner.study.states import FINGERPRINT_ATTR, IDENTITY_ATTR, ROUNDS_ATTR, SERVER_ATTR
from tuner.verdict.gpuhours import CONFIRM_SPENT_ATTR
from tuner.verdict.trials import CONFIRM_ATTR, CONFIRM_TAILS_ATTR

#: what optuna's storage raises while it decodes a stored row: json's ValueError, the state
#: enum's LookupError, its asserts (a NULL value), a TypeError where a JSON value has the
#: wrong shape
DECODE_ERRORS = (ValueError, LookupError, AssertionError, TypeError)
HINT = "edited by hand? restore the file from a copy, or move it away to start afresh"

Check = Callable[[Any], bool]


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _kind(t: type) -> Check:
    return lambda v: isinstance(v, t)


def _maybe(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _map_of(check: Check) -> Check:
    return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())


_TEXT, _FLAG, _RECORD = _kind(str), _kind(bool), _kind(dict)

#: a trial's user attributes tuner reads: key -> (check, what it must hold)
TRIAL_TYPES: dict[str, tuple[Check, str]] = {
    Attr.STATUS: (_TEXT, "a string"),
    Attr.REASON: (_TEXT, "a string"),
    Attr.FAILURE: (_maybe(_TEXT), "a string or null"),
    Attr.METRICS: (_RECORD, "an object"),
    Attr.SERVER_INFO: (_RECORD, "an object"),
    Attr.RESTARTED: (_FLAG, "true or false"),
    Attr.LAUNCHED: (_FLAG, "true or false"),
    Attr.BASELINE: (_FLAG, "true or false"),
    Attr.REPRODUCED: (_FLAG, "true or false"),
    Attr.WORKER: (_TEXT, "a string"),
    Attr.HOME: (_TEXT, "a string"),
    Attr.INFRA_ERROR: (_TEXT, "a string"),
    Attr.SERVER_PGID: (_maybe(_integer), "an integer or null"),
    Attr.LOAD_POINTS: (_list_of(_RECORD), "a list of objects"),
    Attr.CLIENT: (_maybe(_RECORD), "an object or null"),
    Attr.TAILS: (_maybe(_RECORD), "an object or null"),
    Attr.SPENT: (_RECORD, "an object"),
    POOL_ATTR: (_number, "a number"),
    **{
        k: (_integer, "an integer")
        for k in (
            Attr.DUPLICATE_OF,
            Attr.RETRIES,
            Attr.RETRY_OF,
            Attr.PROBE_OF,
            Attr.PROBES_LEFT,
            Attr.EDGE_OF,
            Attr.EDGE_PIN,
            Attr.EDGE_NEIGHBOUR,
        )
    },
    **{k: (_number, "a number") for k in METRIC_ATTRS},
}

#: the study's user attributes tuner reads, by the prefix of their key (most are per worker)
STUDY_TYPES: dict[str, tuple[Check, str]] = {
    FINGERPRINT_ATTR: (_map_of(_TEXT), "an object of strings"),
    IDENTITY_ATTR: (_RECORD, "an object"),
    SERVER_ATTR: (_maybe(_integer), "an integer or null"),
    f"{CONFIRM_ATTR}:": (_map_of(_list_of(_number)), "an object of lists of numbers"),
    f"{CONFIRM_TAILS_ATTR}:": (_map_of(_list_of(_maybe(_RECORD))), "an object of lists"),
    f"{CONFIRM_SPENT_ATTR}:": (_map_of(_list_of(_RECORD)), "an object of lists of objects"),
    f"{ROUNDS_ATTR}:": (
        lambda v: isinstance(v, list) and len(v) == 2 and all(_integer(x) for x in v),
        "a list of two integers",
    ),
}


def check_rows(study: optuna.Study, where: str, path: Path | None = None) -> None:
    """Raise InputFileError(where, ...) naming the first row of `study` that optuna cannot
    decode or that holds a tuner record of the wrong type; `path`: the SQLite file, scanned to
    name a row optuna failed on."""
    try:  # optuna's decoding only: a bug in the checks below keeps its traceback
        attrs = study.user_attrs
        trials = study.get_trials(deepcopy=False)
        constraints = [t.constraints for t in trials]  # optuna's, from a system attribute
    except DECODE_ERRORS as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        found = locate(path) if path is not None else None
        problem = found or f"a row optuna cannot read ({type(exc).__name__}: {first})"
        raise InputFileError(where, f"{problem}; {HINT}") from None
    directions = len(study.directions)
    problem = study_problem(attrs) or next(
        (
            p
            for t, c in zip(trials, constraints, strict=True)
            if (p := trial_problem(t, c, directions))
        ),
        None,
    )
    if problem:
        raise InputFileError(where, f"{problem}; {HINT}")


def study_problem(attrs: Mapping[str, Any]) -> str | None:
    """What is wrong with the study's user attributes tuner reads (None: nothing)."""
    for key, value in attrs.items():
        for prefix, (check, want) in STUDY_TYPES.items():
            if key.startswith(prefix) and not check(value):
                return f"the study's attribute '{key}' must hold {want}, not {_shown(value)}"
    return None


def trial_problem(t: FrozenTrial, constraints: Mapping[str, Any], directions: int) -> str | None:
    """What is wrong with trial `t` as tuner reads it (None: nothing); `constraints`: its
    constraints as optuna gives them."""
    if t.state == TrialState.COMPLETE and (t.values is None or len(t.values) != directions):
        n = "no value" if t.values is None else f"{len(t.values)} values"
        want = "one objective" if directions == 1 else f"{directions} objectives"
        return f"trial {t.number} is COMPLETE with {n}; the study has {want}"
    for key, (check, want) in TRIAL_TYPES.items():
        if key in t.user_attrs and not check(t.user_attrs[key]):
            value = _shown(t.user_attrs[key])
            return f"trial {t.number}'s attribute '{key}' must hold {want}, not {value}"
    if not all(_number(v) for v in constraints.values()):
        return f"trial {t.number}'s constraints must be numbers, not {_shown(constraints)}"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# -- naming the row optuna failed on (SQLite) --------------------------------------------------

#: (table, JSON column, whose row: trial or study) of the rows optuna decodes as JSON
JSON_COLUMNS = (
    ("trial_user_attributes", "value_json", "trial", "attribute"),
    ("trial_system_attributes", "value_json", "trial", "system attribute"),
    ("study_user_attributes", "value_json", "study", "attribute"),
    ("study_system_attributes", "value_json", "study", "system attribute"),
    ("trial_params", "distribution_json", "trial", "parameter's distribution"),
)


def locate(path: Path) -> str | None:
    """The first row of the SQLite study file `path` that optuna cannot decode, named; None
    when the scan finds none (or cannot read the file)."""
    with contextlib.suppress(sqlite3.Error):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return _scan(con)
        finally:
            con.close()
    return None


def _scan(con: sqlite3.Connection) -> str | None:
    number = dict(con.execute("SELECT trial_id, number FROM trials"))
    states = {s.name for s in TrialState}
    for trial_id, state in con.execute("SELECT trial_id, state FROM trials"):
        if state not in states:
            return (
                f"trial {number.get(trial_id)}'s state {state!r} is none of optuna's "
                f"({', '.join(sorted(states))})"
            )
    for trial_id, value, kind in con.execute(
        "SELECT trial_id, value, value_type FROM trial_values"
    ):
        if kind == "FINITE" and not isinstance(value, int | float):
            return (
                f"trial {number.get(trial_id)}'s objective value is {_shown(value)}, not a number"
            )
    for table, column, owner, what in JSON_COLUMNS:
        name = "param_name" if table == "trial_params" else "key"
        rows = con.execute(f"SELECT {owner}_id, {name}, {column} FROM {table}")
        for owner_id, key, raw in rows:
            if not _is_json(raw):
                whose = f"trial {number.get(owner_id)}'s" if owner == "trial" else "the study's"
                return f"{whose} {what} {key!r} is not JSON: {_shown(raw)}"
    return None


def _is_json(raw: Any) -> bool:
    if not isinstance(raw, str):
        return False
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///` URL (None for another database)."""
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
