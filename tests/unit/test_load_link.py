"""A load run is judged on the way it was measured through: a link that broke during it, even
silently (no reset, requests left hanging until the window cut them), makes the run the world's
failure. The endpoint and the load are fakes: this is the fault path's logic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tuner import api
from tuner.config.load import load_study
from tuner.errors import HostUnreachable


class Link:
    """An endpoint whose breaks show only when a channel is next opened (as a silent SSH
    transport's do: paramiko still calls it active)."""

    def __init__(self, silent: bool):
        self.silent = silent
        self.count = 0
        self.probes = 0

    def breaks(self) -> int:
        return self.count

    def connects(self, port: int, timeout_s: float) -> bool | None:
        self.probes += 1
        if self.silent:
            self.count += 1  # the probe found the transport dead and replaced it
            return None
        return True

    def describe(self, port: int) -> str:
        return f"an SSH tunnel to port {port}"


def _run(monkeypatch: pytest.MonkeyPatch, link: Link) -> Any:
    # requests hung until the window cut them: no error, nothing completed
    result = SimpleNamespace(metrics=lambda: SimpleNamespace(errors=0))
    monkeypatch.setattr(api, "run_load_sync", lambda *a, **k: result)
    cfg = load_study(REPO / "search_spaces" / "demo-sim.yaml")
    return api.load_runner(cfg, [], None, link)("http://127.0.0.1:9", {"concurrency": 4}), result


def test_a_link_that_fell_silent_during_the_run_is_the_worlds(monkeypatch) -> None:
    with pytest.raises(HostUnreachable, match=r"broke during the load run \(it went silent\)"):
        _run(monkeypatch, Link(silent=True))


def test_a_healthy_link_keeps_the_measurement(monkeypatch) -> None:
    link = Link(silent=False)
    got, result = _run(monkeypatch, link)
    assert got is result and link.probes == 1
