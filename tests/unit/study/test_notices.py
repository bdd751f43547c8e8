"""Once-a-run warnings off a trial's measurement (study/notices.py): said once however many
trials show them, each kind on its own, and the caller's own hook still called."""

from __future__ import annotations

from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, create_trial

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.objective import SLOSection
from tuner.loadgen.metrics import RequestRecord
from tuner.outcome import Attr
from tuner.study.notices import trial_notices
from tuner.verdict.tails import tails_of

SLO = SLOSection(p99_ttft_ms=5000, p99_tpot_ms=50)


def _cfg(**workload):
    data = study_dict(
        space={"mem-fraction-static": {"low": 0.8, "high": 0.95}},
        objective__slo={"p99_ttft_ms": 5000, "p99_tpot_ms": 50},
        workload={"kind": "random", "input_len": 100, "output_len": 101, **workload},
    )
    return parse_study(data, "s.yaml")


def _trial(n_requests: int, number: int = 0) -> FrozenTrial:
    """A trial whose run ended `n_requests` requests (TPOT 30 ms, TTFT 0.2 s)."""
    recs = [RequestRecord(i, True, 100, 101, 0.0, 3.2, 0.2) for i in range(n_requests)]
    t = create_trial(
        params={"mem-fraction-static": 0.9},
        distributions={"mem-fraction-static": FloatDistribution(0.8, 0.95)},
        value=1000.0,
        user_attrs={Attr.TAILS: tails_of(recs, SLO), Attr.METRICS: {}},
    )
    t.number = number
    return t


def test_p99s_over_too_few_requests_are_said_once_and_the_hook_still_runs() -> None:
    said: list[str] = []
    seen: list[int] = []
    hook = trial_notices(_cfg(duration_s=30), said.append, lambda t: seen.append(t.number))
    hook(_trial(200, 0))
    assert said == [] and seen == [0]
    hook(_trial(6, 1))
    hook(_trial(6, 2))
    assert seen == [0, 1, 2]
    # one warning a run: the first thin latency's (TTFT: 6 started, TPOT: 6 ended)
    assert len(said) == 1 and said[0].startswith("warning: p99 TTFT was read over 6 requests")
    assert "trial 1's run" in said[0] and "workload.duration_s (now 30 s)" in said[0]


def test_a_run_bounded_by_its_request_count_is_told_to_raise_that() -> None:
    said: list[str] = []
    trial_notices(_cfg(duration_s=None, num_requests=40), said.append)(_trial(40))
    assert len(said) == 1 and "workload.num_requests (now 40)" in said[0]
