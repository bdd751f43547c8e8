"""Speculative decoding's accept lengths and SGLang's counters of them. Pure.

Each decode iteration verifies `num_draft_tokens` per request and keeps 1 + the run of accepted
drafts; `SpecSampler` draws that length from the profile's acceptance model (one uniform per
request and step, from the engine's seeded generator) and keeps SGLang's counters: the accept
length and rate of the decode log line, and the running average `/server_info` reports.
"""

from __future__ import annotations

import random
from bisect import bisect_left


class SpecSampler:
    """Accept lengths drawn from the acceptance model, and SGLang's accept-length counters.

    `accept[i]`: P(draft position i+1 accepted | the ones before were). One uniform draw per
    request and step: the accept length is 1 + the number of positions j whose survival
    P(first j accepted) exceeds it.
    """

    __slots__ = (
        "accepted",
        "count",
        "last_len",
        "last_rate",
        "ndt",
        "neg",
        "new_rate",
        "rng",
        "total_accepted",
        "total_count",
    )

    def __init__(
        self, accept: tuple[float, ...], ndt: int, new_rate: bool, rng: random.Random
    ) -> None:
        survival, p = [], 1.0
        for q in accept:
            p *= q
            survival.append(-p)  # ascending for bisect
        self.neg = survival
        self.rng = rng
        self.ndt = ndt
        self.new_rate = new_rate
        self.accepted = self.count = 0  # since the last decode log line
        self.total_accepted = self.total_count = 0  # accumulated at each log line, as SGLang
        self.last_len = self.last_rate = 0.0

    def draw(self) -> int:
        return 1 + bisect_left(self.neg, -self.rng.random())

    def record(self, bs: int, accepted: int) -> None:
        self.accepted += accepted
        self.count += bs

    def log(self) -> tuple[float, float]:
        """(accept len, accept rate) for the decode log line; resets the interval (SGLang's
        scheduler_metrics_mixin.py:272-294, 0.5.23 metrics_reporter.py:965-1005)."""
        ct = self.count
        length = self.accepted / ct if ct else 0.0
        if self.new_rate:  # correct drafts over drafted tokens
            drafted = ct * (self.ndt - 1)
            rate = (self.accepted - ct) / drafted if drafted > 0 else 0.0
        else:  # accepted tokens (bonus included) over draft tokens
            drafted = ct * self.ndt
            rate = self.accepted / drafted if drafted > 0 else 0.0
        self.total_accepted += self.accepted
        self.total_count += ct
        self.accepted = self.count = 0
        self.last_len, self.last_rate = length, rate
        return length, rate

    @property
    def average(self) -> float | None:
        """`avg_spec_accept_length` of /server_info: None before the first decode log line."""
        return self.total_accepted / self.total_count if self.total_count else None
