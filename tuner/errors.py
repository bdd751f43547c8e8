"""One exception tree for the whole tool.

    Exception
    ├── TunerError            the user's mistake: the CLI prints one line, exit 2, nothing written
    │   ├── ConfigError         study file or command-line value (names file and key path)
    │   │   ├── UnknownVersionError   `sglang_version` outside tuner.sglang's tables
    │   │   └── DuplicateFlagError    one SGLang flag given under two names
    │   ├── InputFileError      a data file the user gave: model config.json, workload dataset
    │   ├── ModelConfigError    a model config lacks a field the KV calculus needs
    │   ├── HostTrustError      SSH host key unknown or changed, authentication refused
    │   ├── StudyMismatchError  resuming a study whose fingerprint changed
    │   ├── StudyBusyError      the same study and worker is already running in another process
    │   └── SetupError          the target cannot run any trial (launch command missing, ...)
    ├── InfraError            the world failed, not the config: a trial becomes FAIL and is retried
    │   ├── HostUnreachable     cannot connect, or the connection dropped
    │   ├── CommandTimeout      a remote or local command ran past its deadline
    │   ├── ServerHung          the server's process lives but stopped answering
    │   └── TrialTimeout        the trial ran past budget.trial_timeout
    └── HaltError             the world failed in a way retrying cannot fix: the study stops,
        │                     one line, exit 1, and the same command resumes it later
        ├── PortHeldError       the server port is held by a process the tuner did not start
        └── InfraRunaway        budget.max_consecutive_infra_failures reached

A server that fails to start *because of its flags* (OOM, host memory) is not an exception
here: `server/lifecycle.py` returns it as a classified outcome, and the study records it as infeasible.
"""

from __future__ import annotations

import unicodedata


def one_line(text: str) -> str:
    """`text` as one line of plain text: control characters (a newline, an ANSI escape, a line
    separator) in a key or value the user wrote are shown escaped, never acted on."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cf") and ch != "\u200d"
        else ch
        for ch in text
    )


class TunerError(Exception):
    """A mistake the user can fix; its message is the single line the CLI prints."""


class ConfigError(TunerError):
    """A bad value in a study file or on the command line.

    Rendered as `FILE: key.path: message` (or `key.path: message` without a file).
    """

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        self.detail = message
        parts = [p for p in (file, key) if p]
        super().__init__(": ".join([*parts, message]))


class InputFileError(TunerError):
    """A data file the user named is missing or malformed (`FILE:LINE: message`)."""

    def __init__(self, file: str, message: str, *, line: int | None = None):
        self.file = file
        self.line = line
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {message}")


class ModelConfigError(TunerError):
    """A model config lacks a field the KV calculus needs (the message names the field)."""


class HostTrustError(TunerError):
    """SSH refused to trust the host, or the host refused our credentials. Never retried."""


class StudyMismatchError(TunerError):
    """An existing study was made from a different study file (search space, workload, ...)."""


class StudyBusyError(TunerError):
    """Another live process runs the same study as the same worker (its lock is held)."""


class SetupError(TunerError):
    """Certainly the user's setup, not a configuration or a passing fault: the launch command
    is not found or not executable, the working directory is missing, permission denied.
    The study stops at the first trial that shows it."""


class InfraError(Exception):
    """Infrastructure failed (not the configuration): the trial fails and may be retried."""


class HostUnreachable(InfraError):
    """The host cannot be reached, or the connection to it dropped."""


class CommandTimeout(InfraError):
    """A command on a host ran past its deadline."""


class ServerHung(InfraError):
    """The server's process group is alive but it stopped answering (/health, requests)."""


class TrialTimeout(InfraError):
    """The trial ran past `budget.trial_timeout`; its server was stopped."""


class HaltError(Exception):
    """Retrying cannot fix this: stop the study (one line, exit 1); rerunning resumes it.

    Deliberately not an InfraError, so optuna's `catch=` lets it end `optimize`.
    """


class PortHeldError(HaltError):
    """The server's port is held by a process the tuner cannot attribute to itself."""


class InfraRunaway(HaltError):
    """Too many consecutive trials failed for the world's reasons: something is down."""
