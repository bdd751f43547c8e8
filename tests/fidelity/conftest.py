"""The fidelity tests' shared fixture: one simulator per played version per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.played import VERSIONS, played
from tests.helpers.simproc import SimProc


@pytest.fixture(scope="module", params=VERSIONS)
def sim(request: pytest.FixtureRequest) -> Iterator[SimProc]:
    """A ready simulator playing each version in turn (`sim.version`), killed after the module."""
    with played(request.param) as proc:
        proc.version = request.param  # type: ignore[attr-defined]
        yield proc
