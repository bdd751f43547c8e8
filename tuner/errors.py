"""One exception tree for the whole tool.

    Exception
    ├── TunerError            the user's mistake: the CLI prints one line, exit 2, nothing written
    │   ├── ConfigError         study file or command-line value (names file and key path)
    │   │   ├── UnknownVersionError   `sglang_version` outside tuner.sglang's tables
    │   │   └── DuplicateFlagError    one SGLang flag given under two names
    │   ├── InputFileError      a data file the user gave: model config.json, workload dataset
    │   ├── ModelConfigError    a model config lacks a field the KV calculus needs
    │   ├── HostTrustError      SSH host key unknown or changed, authentication refused
    │   └── StudyMismatchError  resuming a study whose fingerprint changed
    └── InfraError            the world failed, not the config: a trial becomes FAIL and is retried
        ├── HostUnreachable     cannot connect, or the connection dropped
        └── CommandTimeout      a remote or local command ran past its deadline

A server that fails to start *because of its flags* (OOM, host memory) is not an exception
here: `lifecycle.py` returns it as a classified outcome, and the study records it as infeasible.
"""

from __future__ import annotations


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


class InfraError(Exception):
    """Infrastructure failed (not the configuration): the trial fails and may be retried."""


class HostUnreachable(InfraError):
    """The host cannot be reached, or the connection to it dropped."""


class CommandTimeout(InfraError):
    """A command on a host ran past its deadline."""
