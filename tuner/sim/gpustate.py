"""What a live simulated server holds on its simulated GPUs, for the simulated nvidia-smi (smi.py).

A real SGLang host has nvidia-smi, and the tuner reads it after each load run (the memory the
largest prefill left reserved: search/ceiling.py) and after each stop (until the old server's
pids hold no GPU memory). The simulator's GPUs exist only in its process, so each serving
simulator keeps one small JSON file per port in a directory of this machine's temp dir (one
per user): its pid, how many GPUs it uses and what nvidia-smi's memory.used would read on each.
The file is rewritten (atomically: a rename) whenever the reading changes, which is when a larger
prefill batch ran or a flush emptied the cache, and removed when the process ends. A file whose
pid is gone (a SIGKILLed simulator) is ignored, as nvidia-smi forgets a dead process, and removed
by the next simulator that starts serving (`sweep_stale`).

The port names the file because only one process can serve a port: two studies on one machine
(the test suite's parallel workers) never read each other's server.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

#: the directory's name under the temp dir (TMPDIR), shared by the simulators and smi.py
DIR_NAME = "tuner-sim-gpus"


@dataclass(frozen=True)
class GpuState:
    """One serving simulator's GPUs as nvidia-smi would list them."""

    pid: int
    gpus: int  # how many GPUs the server uses (its ranks)
    used_mib: float  # memory.used on each of them


def state_dir() -> Path:
    """One per user: another user's simulators neither block nor read this one's files."""
    return Path(tempfile.gettempdir()) / f"{DIR_NAME}-{os.getuid()}"


def state_path(port: int) -> Path:
    return state_dir() / f"{int(port)}.json"


def write_state(port: int, state: GpuState) -> None:
    """Publish `state` for `port`: written beside, then renamed over (a reader never sees half)."""
    path = state_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{state.pid}")
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, path)


def remove_state(port: int, pid: int) -> None:
    """Remove `port`'s file if it is still `pid`'s (a newer server may have taken the port)."""
    got = read_state(port, alive_only=False)
    if got is not None and got.pid == pid:
        with contextlib.suppress(OSError):
            state_path(port).unlink()


def sweep_stale() -> int:
    """Remove the files of simulators that are gone (SIGKILLed: nobody removed theirs); how
    many. A starting simulator calls it once, so killed ones do not pile up in the temp dir."""
    gone = 0
    for path in state_dir().glob("*.json"):
        if path.stem.isdigit() and read_state(int(path.stem)) is None:
            with contextlib.suppress(OSError):
                path.unlink()
                gone += 1
    return gone


def read_state(port: int, *, alive_only: bool = True) -> GpuState | None:
    """The state of the simulator serving `port`, or None: no file, an unreadable one, or (with
    `alive_only`) one whose process is gone."""
    try:
        raw = json.loads(state_path(port).read_text())
        state = GpuState(int(raw["pid"]), int(raw["gpus"]), float(raw["used_mib"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if alive_only and not _alive(state.pid):
        return None
    return state


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed simulator its parent has not reaped yet
    holds no GPU memory)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: the signal check is all there is
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
