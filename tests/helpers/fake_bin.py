"""Fake command-line tools for tests: executables in `root/bin` that run a helper script with
their state in `root/state`, put first on a PATH (the fake docker and the fake Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class FakeBin:
    """`commands`: executable name -> the arguments the script gets before the caller's (the
    command's own name when one script plays several); `records`: the state's sub-folder the
    script keeps its objects in; `config`: what the script reads from `state/config.json`."""

    def __init__(
        self,
        root: Path,
        script: Path,
        commands: Mapping[str, str],
        records: str,
        config: Mapping[str, Any],
    ):
        self.bin = root / "bin"
        self.state = root / "state"
        (self.state / records).mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.state / "config.json").write_text(json.dumps(dict(config)))
        for name, first in commands.items():
            exe = self.bin / name
            lead = f"{first} " if first else ""
            exe.write_text(
                f'#!/bin/sh\nexec {sys.executable} {script} --state {self.state} {lead}"$@"\n'
            )
            exe.chmod(0o755)

    @property
    def path(self) -> str:
        """PATH with the fakes first."""
        return f"{self.bin}:{os.environ.get('PATH', '')}"

    def calls(self) -> list[list[str]]:
        """argv of every call so far, in order."""
        f = self.state / "calls.jsonl"
        return [json.loads(ln)["argv"] for ln in f.read_text().splitlines()] if f.exists() else []


def follow(log: Path, proc: subprocess.Popen) -> int:
    """Copy `log` to stdout as it grows until `proc` ends (an attached client: `docker run`,
    `srun`); its exit code as a shell reports it (128 + N for a signal)."""
    with open(log, "rb") as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            elif proc.poll() is not None:
                sys.stdout.buffer.write(f.read())
                sys.stdout.buffer.flush()
                break
            else:
                time.sleep(0.05)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
