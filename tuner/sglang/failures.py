"""Why an SGLang server failed, from its exit code and log tail (sglang-reference.md 5 and 6). Pure.

`explain_failure` reads SGLang's own messages; the classes it cannot tell from a log (a start
that timed out, a stale or mismatched server) are found by the lifecycle and share the enum.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence


class FailureClass(enum.StrEnum):
    """Why a start failed or a server died; the values are what trial records store."""

    #: mfs too high: start-up OOM after the weights (graph capture, KV pool)
    OOM_CUDA_GRAPH = "oom_cuda_graph"
    #: a prefill/decode ran out of memory (often under load, after ready)
    OOM_RUNTIME = "oom_runtime"
    #: mfs too low / weights too big: no room for the KV pool
    NOT_ENOUGH_MEMORY = "not_enough_memory"
    #: HiCache host pool too large, or not larger than the device pool
    HOST_MEMORY = "host_memory"
    #: argparse rejected a flag (exit 2)
    BAD_FLAG = "bad_flag"
    #: the port is taken (before start, or uvicorn could not bind)
    PORT_IN_USE = "port_in_use"
    #: not ready within ready_s; the group was killed
    TIMEOUT = "timeout"
    #: died for another reason (evidence in the log tail)
    CRASHED = "crashed"
    #: the server answering on the port is not the one we started
    STALE_SERVER = "stale_server"
    #: ours, but it resolved different values than we asked for
    ARGS_MISMATCH = "args_mismatch"


#: failures with SGLang's own evidence that the flags caused them (sglang-reference.md 6): only
#: these make a trial infeasible; every other class is the world's until it reproduces
CONFIG_FAILURES = frozenset(
    {
        FailureClass.OOM_CUDA_GRAPH,
        FailureClass.OOM_RUNTIME,
        FailureClass.NOT_ENOUGH_MEMORY,
        FailureClass.HOST_MEMORY,
        FailureClass.BAD_FLAG,
        FailureClass.ARGS_MISMATCH,
    }
)


def is_config_failure(failure: str | None) -> bool:
    """True when the failure class is evidence against the configuration itself."""
    return failure in CONFIG_FAILURES


#: the line SGLang logs once the warm-up request succeeded (the server is ready)
READY_LINE = re.compile(r"The server is fired up and ready to roll", re.I)
#: lines SGLang logs once the weights are loaded / the KV pool is allocated
WEIGHTS_LOADED_LINE = re.compile(r"Load weight end|KV Cache is allocated", re.I)

# (class, pattern) in priority order: the first class with a matching line wins. More specific
# messages come first ("Capture cuda graph failed: CUDA out of memory" is a graph OOM, "Not enough
# host memory" is not "Not enough memory").
_PATTERNS: tuple[tuple[FailureClass, re.Pattern[str]], ...] = tuple(
    (cls, re.compile(p, re.IGNORECASE))
    for cls, p in (
        (FailureClass.OOM_CUDA_GRAPH, r"capture cuda graph failed|cuda graph.*out of memory"),
        (FailureClass.HOST_MEMORY, r"not enough host memory available"),
        (FailureClass.HOST_MEMORY, r"host memory should be larger than the device memory"),
        (
            FailureClass.NOT_ENOUGH_MEMORY,
            r"not enough memory\. please try to increase --mem-fraction-static",
        ),
        (FailureClass.OOM_RUNTIME, r"(prefill|decode) out of memory"),
        (FailureClass.PORT_IN_USE, r"address already in use|\[errno 98\]"),
        (FailureClass.BAD_FLAG, r"arguments .* are mutually exclusive"),  # SGLang's own checks
    )
)
_ARGPARSE = re.compile(r": error: (unrecognized arguments|argument |invalid |the following)", re.I)
_CUDA_OOM = re.compile(r"cuda out of memory|outofmemoryerror|cuda error: out of memory", re.I)


def _last(lines: Sequence[str], pattern: re.Pattern[str]) -> str | None:
    return next((ln for ln in reversed(lines) if pattern.search(ln)), None)


def _bare_oom(lines: Sequence[str], oom: str) -> tuple[FailureClass, str]:
    """A torch OOM without SGLang's advice: where in start-up it happened tells which knob."""
    text = "\n".join(lines)
    if READY_LINE.search(text):
        return FailureClass.OOM_RUNTIME, oom.strip()
    if not WEIGHTS_LOADED_LINE.search(text):
        return FailureClass.NOT_ENOUGH_MEMORY, oom.strip()
    # after the weights, before ready: the KV pool or the CUDA graphs did not fit, i.e. mfs
    # too high -- the same lesson as a graph-capture OOM, so the same class
    return FailureClass.OOM_CUDA_GRAPH, oom.strip()


#: uvicorn's per-request access line: after a scheduler's death the HTTP server can answer
#: (503) for a while, and those lines bury SGLang's message past any short tail
_ACCESS_LINE = re.compile(r'^INFO:\s+\S+ - "[A-Z]+ \S* HTTP/[\d.]+" \d{3}')


def evidence_tail(lines: Sequence[str], keep: int) -> list[str]:
    """The last `keep` lines of a log that can hold evidence (access lines dropped)."""
    return [ln for ln in lines if not _ACCESS_LINE.match(ln)][-keep:] if keep > 0 else []


def explain_failure(exit_code: int | None, log_tail: Sequence[str]) -> tuple[FailureClass, str]:
    """(failure class, the log line that shows it) for a server that exited or died."""
    lines = [ln.rstrip() for ln in log_tail]
    if exit_code == 2 or any(_ARGPARSE.search(ln) for ln in lines):
        hit = _last(lines, _ARGPARSE)
        if hit is not None:
            return FailureClass.BAD_FLAG, hit.strip()
    for cls, pat in _PATTERNS:
        hit = _last(lines, pat)
        if hit is not None:
            return cls, hit.strip()
    oom = _last(lines, _CUDA_OOM)
    if oom is not None:
        return _bare_oom(lines, oom)
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    why = f"exit code {exit_code}" if exit_code is not None else "killed by a signal"
    return FailureClass.CRASHED, f"{why}: {last}" if last else why


#: bash's codes for "found but not executable" and "not found"
SETUP_EXIT_CODES = frozenset({126, 127})
_SETUP_LINE = re.compile(
    r"command not found|no such file or directory|permission denied|not found$", re.I
)


def setup_failure(
    exit_code: int | None, log_tail: Sequence[str], program: str, module: str | None = None
) -> str | None:
    """The evidence that a start failed because of the user's setup, not the flags, or None.

    Setup means the launch command itself: bash's exit 126/127, a "command not found", "No such
    file or directory" or "Permission denied" line naming `program`, or Python's "No module
    named M" for the `-m` module `module` (SGLang not installed). SGLang's own errors about
    other files (a missing model path) are not taken for it.
    """
    lines = [ln.strip() for ln in log_tail if ln.strip()]
    base = program.rsplit("/", 1)[-1]
    for ln in reversed(lines):
        if _SETUP_LINE.search(ln) and (program in ln or f"{base}:" in ln):
            return ln
        if module and re.search(rf"No module named '?{re.escape(module.split('.')[0])}\b", ln):
            return ln
    if exit_code in SETUP_EXIT_CODES:
        return lines[-1] if lines else f"exit code {exit_code}"
    return None
