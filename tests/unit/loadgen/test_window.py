"""loadgen/window.py short_window: a window under two request lives per stream measures a ramp-up."""

from __future__ import annotations

import pytest

from tuner.loadgen.window import MIN_LIVES, short_window


def test_a_window_finishing_under_two_requests_per_stream_is_short() -> None:
    # the demo's 6 s window at concurrency 160: 81 requests finished, 0.5 per stream
    note = short_window(6.0, {"completed": 81}, 160)
    assert note is not None
    assert "workload.duration_s 6 s" in note and "81 (0.5 per stream" in note
    # suggested: enough for MIN_LIVES at the rate seen (6 x 2 / 0.506 = 23.7 -> 25 s)
    assert note.endswith("consider duration_s >= 25 s")


@pytest.mark.parametrize(
    ("duration", "metrics", "concurrency"),
    [
        (30.0, {"completed": 192}, 64),  # three lives per stream: a steady state
        (30.0, {"completed": int(MIN_LIVES * 64)}, 64),  # exactly two: enough
        (None, {"completed": 5}, 64),  # bounded by a request count, no window
        (30.0, {"completed": 5}, None),  # an open loop (request rate): no streams to count
        (30.0, {}, 64),  # nothing measured (a failed start)
    ],
)
def test_no_warning_when_the_window_is_long_enough_or_unknown(
    duration: float | None, metrics: dict, concurrency: int | None
) -> None:
    assert short_window(duration, metrics, concurrency) is None


def test_a_window_where_nothing_finished_still_suggests_a_bounded_length() -> None:
    note = short_window(30.0, {"completed": 0}, 104)
    assert note is not None and note.endswith("consider duration_s >= 600 s")
