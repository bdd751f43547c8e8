"""Pure parts of the load client: options from the workload section, payloads, chunk timing."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.workload import WorkloadSection
from tuner.errors import ConfigError
from tuner.loadgen.client import Client, RequestState
from tuner.loadgen.options import LoadOptions, load_options
from tuner.loadgen.workload import Request


def _opts(**workload: object) -> LoadOptions:
    return load_options(WorkloadSection(**workload), concurrency=1)


def test_first_chunk_sets_ttft_later_gaps_split_per_token() -> None:
    st = RequestState()
    st.advance(0, 10.5, 10.0)  # an empty chunk (role-only delta) changes nothing
    assert st.ttft is None and st.tokens == 0
    st.advance(2, 10.5, 10.0)  # first chunk carries two tokens: TTFT only
    st.advance(1, 10.6, 10.0)
    st.advance(4, 11.0, 10.0)  # a coalesced chunk: its gap shared by its four tokens
    assert st.ttft == pytest.approx(0.5)
    assert st.tokens == 7
    assert st.itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])


def test_native_payload_sends_ids_openai_sends_words() -> None:
    ids = Request(0, 3, 5, token_ids=(1001, 1002, 1003))
    native = Client(None, "http://h:1/", _opts()).payload(ids)  # type: ignore[arg-type]
    assert native["input_ids"] == [1001, 1002, 1003] and "text" not in native
    assert native["sampling_params"] == {
        "max_new_tokens": 5,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    assert native["stream"] is True
    text = Request(1, 2, 4, text="hello world")
    assert Client(None, "http://h:1", _opts()).payload(text)["text"] == "hello world"  # type: ignore[arg-type]
    oa = Client(None, "http://h:1", _opts(backend="openai")).payload(ids)  # type: ignore[arg-type]
    assert oa["prompt"] == "w1001 w1002 w1003" and oa["max_tokens"] == 5
    assert oa["stream_options"] == {"include_usage": True}
    chat = Client(None, "http://h:1", _opts(backend="openai-chat")).payload(text)  # type: ignore[arg-type]
    assert chat["messages"] == [{"role": "user", "content": "hello world"}]


def test_api_key_header_and_hidden_repr() -> None:
    opts = load_options(WorkloadSection(), concurrency=1, api_key="topsecret")
    assert "topsecret" not in repr(opts) and "topsecret" not in str(opts)
    assert Client(None, "http://h", opts).headers == {"Authorization": "Bearer topsecret"}  # type: ignore[arg-type]
    assert Client(None, "http://h", _opts()).headers == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"backend": "vllm"}, "workload.backend"),
        ({"request_rate": 0.0}, "workload.request_rate"),
        ({"duration_s": -1.0}, "workload.duration_s"),
        ({"num_requests": 0}, "workload.num_requests"),
        ({"max_error_rate": 2.0}, "workload.max_error_rate"),
        ({"request_timeout_s": 0.0}, "workload.request_timeout_s"),
    ],
)
def test_bad_options_are_config_errors(kwargs: dict, key: str) -> None:
    # the user-facing checks are the study file's (config.WorkloadSection), naming its keys
    study = study_dict(space={"mem-fraction-static": {"low": 0.5, "high": 0.9}}, workload=kwargs)
    with pytest.raises(ConfigError, match=key):
        parse_study(study)


def test_a_bad_run_value_is_a_bug_not_a_user_error() -> None:
    # concurrency and a searched request rate come from the caller, already checked
    with pytest.raises(ValueError, match="concurrency"):
        load_options(WorkloadSection(), concurrency=0)
    with pytest.raises(ValueError, match="request_rate"):
        load_options(WorkloadSection(), concurrency=1, request_rate=0.0)


def test_defaults_are_closed_loop() -> None:
    opts = _opts()
    assert math.isinf(opts.request_rate) and opts.stream and opts.warmup_requests == 1


def test_options_follow_the_workload_and_a_trial_rate_overrides() -> None:
    w = WorkloadSection(
        backend="openai",
        duration_s=30,
        num_requests=99,
        warmup_requests=3,
        flush_cache=False,
        request_rate=5.0,
        request_timeout_s=7,
        max_error_rate=0.2,
        stream=False,
        seed=4,
        model="m",
    )
    opts = load_options(w, concurrency=8, api_key="k", max_loop_lag_ms=250)
    assert (opts.backend, opts.concurrency, opts.request_rate, opts.duration_s) == (
        "openai",
        8,
        5.0,
        30,
    )
    assert (opts.num_requests, opts.warmup_requests, opts.flush_cache) == (99, 3, False)
    assert (opts.request_timeout_s, opts.max_error_rate, opts.stream) == (7, 0.2, False)
    assert (opts.seed, opts.model, opts.api_key, opts.max_loop_lag_ms) == (4, "m", "k", 250)
    assert load_options(w, concurrency=8, request_rate=9.5).request_rate == 9.5


def test_workload_keys_have_one_default_the_sections() -> None:
    # a LoadOptions field named like a workload key is copied from it, never defaulted here
    shared = [f for f in dataclasses.fields(LoadOptions) if f.name in WorkloadSection.model_fields]
    assert len(shared) >= 10
    assert [f.name for f in shared if f.default is not dataclasses.MISSING] == []


def test_bounds_derive_from_the_window_with_floors_and_the_request_timeout_as_ceiling() -> None:
    from tuner.loadgen.bounds import Bounds

    b = Bounds.of(_opts(duration_s=60, request_timeout_s=600))
    assert (b.warmup_s, b.flush_s, b.stall_s, b.quiet_s, b.lookup_s) == (30, 15, 15, 15, 10)
    assert b.total_s == 10 + 30 + 15 + 2 * 5 + 60 + 5
    assert b.request_timeout(left_s=20) == 25 and b.request_timeout(left_s=None) == 600
    short = Bounds.of(_opts(duration_s=2, request_timeout_s=600))
    assert (short.warmup_s, short.flush_s, short.stall_s, short.quiet_s) == (10, 5, 5, 0.5)
    tight = Bounds.of(_opts(duration_s=60, request_timeout_s=3))  # the ceiling wins
    assert (tight.warmup_s, tight.flush_s, tight.lookup_s) == (3, 3, 3)
    assert tight.request_timeout(left_s=50) == 3 and tight.stall_s == 5
    counted = Bounds.of(_opts(duration_s=None, num_requests=10))
    assert not counted.timed and counted.total_s == 10 + 30 + 15 + 10 + 15 + 5


def test_silence_counts_only_while_requests_wait_and_a_timeout_does_not_reset_it() -> None:
    c = Client(None, "http://h:1/", _opts())  # type: ignore[arg-type]
    assert c.silence(1e9) == 0.0  # nothing asked: idle, not silent
    c.pending, c.waiting_since = 1, 100.0
    assert c.silence(103.0) == pytest.approx(3.0)
    c.hear()
    assert c.silence(c.heard_at + 1.0) == pytest.approx(1.0)
