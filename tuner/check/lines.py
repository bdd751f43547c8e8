"""One line of `tuner check`: a status, the check's name, what was found and what to do. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"


@dataclass(frozen=True)
class CheckLine:
    """What one check found.

    `status` is ok, warn (the night can run, but look), FAIL (the night would fail: `detail`
    says what to do) or skip (an earlier FAIL makes this check meaningless, or it does not
    apply). `error` is the exception `tuner tune` raises for a FAIL, so the exit code keeps
    the CLI's convention: a TunerError subclass (the user's to fix: exit 2) or an InfraError
    subclass (the world's: exit 1).
    """

    status: str
    name: str
    detail: str
    error: type[Exception] | None = None

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def ok(name: str, detail: str) -> CheckLine:
    return CheckLine(OK, name, detail)


def warn(name: str, detail: str) -> CheckLine:
    return CheckLine(WARN, name, detail)


def fail(name: str, detail: str, error: type[Exception]) -> CheckLine:
    return CheckLine(FAIL, name, detail, error)


def skip(name: str, detail: str) -> CheckLine:
    return CheckLine(SKIP, name, detail)


def render(lines: Sequence[CheckLine]) -> str:
    """The lines as aligned plain text: status, name, detail."""
    width = max((len(line.name) for line in lines), default=0)
    return "".join(f"{line.status:<4}  {line.name:<{width}}  {line.detail}\n" for line in lines)
