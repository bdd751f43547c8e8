"""Pure parts of the load client: option validation, payloads, per-chunk timing bookkeeping."""

from __future__ import annotations

import math

import pytest

from tuner.errors import ConfigError
from tuner.loadgen import LoadOptions, _Client, _State
from tuner.workload import Request


def test_first_chunk_sets_ttft_later_gaps_split_per_token() -> None:
    st = _State()
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
    native = _Client(None, "http://h:1/", LoadOptions()).payload(ids)  # type: ignore[arg-type]
    assert native["input_ids"] == [1001, 1002, 1003] and "text" not in native
    assert native["sampling_params"] == {
        "max_new_tokens": 5,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    assert native["stream"] is True
    text = Request(1, 2, 4, text="hello world")
    assert _Client(None, "http://h:1", LoadOptions()).payload(text)["text"] == "hello world"  # type: ignore[arg-type]
    oa = _Client(None, "http://h:1", LoadOptions(backend="openai")).payload(ids)  # type: ignore[arg-type]
    assert oa["prompt"] == "w1001 w1002 w1003" and oa["max_tokens"] == 5
    assert oa["stream_options"] == {"include_usage": True}
    chat = _Client(None, "http://h:1", LoadOptions(backend="openai-chat")).payload(text)  # type: ignore[arg-type]
    assert chat["messages"] == [{"role": "user", "content": "hello world"}]


def test_api_key_header_and_hidden_repr() -> None:
    opts = LoadOptions(api_key="topsecret")
    assert "topsecret" not in repr(opts) and "topsecret" not in str(opts)
    assert _Client(None, "http://h", opts).headers == {"Authorization": "Bearer topsecret"}  # type: ignore[arg-type]
    assert _Client(None, "http://h", LoadOptions()).headers == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"backend": "vllm"}, "workload.backend"),
        ({"concurrency": 0}, "workload.concurrency"),
        ({"request_rate": 0.0}, "workload.request_rate"),
        ({"duration_s": -1.0}, "workload.duration_s"),
        ({"num_requests": 0}, "workload.num_requests"),
        ({"error_budget": 2.0}, "workload.error_budget"),
        ({"request_timeout_s": 0.0}, "workload.request_timeout_s"),
    ],
)
def test_bad_options_are_config_errors(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        LoadOptions(**kwargs)


def test_defaults_are_closed_loop() -> None:
    opts = LoadOptions()
    assert math.isinf(opts.request_rate) and opts.stream and opts.warmup_requests == 1
