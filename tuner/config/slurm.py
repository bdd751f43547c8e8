"""The study file's `target.slurm:`: the Slurm allocation held for the study and its steps (the
commands it implies are built in `server/slurm.py`). Pure.

    target:
      host: login-node            # where salloc/srun/squeue/scancel run (local, or over SSH)
      workdir: /shared/tuner      # a directory the compute nodes see too
      slurm:
        partition: gpu
        account: my-project       # optional
        gpus: 8                   # per node: --gres=gpu:8
        time: "12:00:00"          # the allocation's walltime (quoted), or 12h
        options: [--qos=high, --cpus-per-gpu=16, --mem=0]
        srun_options: [--container-image=lmsysorg/sglang:latest]   # pyxis, optional
    server:
      host: 0.0.0.0               # the server listens where the login node reaches it
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from tuner.config.base import Duration, Model, parse_duration

#: a Slurm name the tuner writes (job name prefix, account): no space, comma or shell character
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: one partition or several (`gpu,gpu-long`: Slurm takes the first that can start the job)
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
#: Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_SLURM_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+))?(?::(\d+))?|(\d+)(?::(\d+))?(?::(\d+))?)$")
_UNIT_TIME = re.compile(r"^\d+(\.\d+)?[smhd]$")

#: salloc options the tuner owns: it names, sizes and waits for its allocation itself
_OWNED_SALLOC = {
    **dict.fromkeys(("-J", "--job-name"), "the tuner names its allocation to find it again"),
    "--no-shell": "the tuner always passes it (the allocation is held without a shell)",
    **dict.fromkeys(("-p", "--partition"), "use target.slurm.partition"),
    **dict.fromkeys(("-A", "--account"), "use target.slurm.account"),
    **dict.fromkeys(("-t", "--time"), "use target.slurm.time"),
    **dict.fromkeys(
        ("-N", "--nodes"), "one node per allocation (a server spanning nodes is not yet)"
    ),
    **dict.fromkeys(("--gres", "-G", "--gpus"), "use target.slurm.gpus (GPUs per node)"),
    **dict.fromkeys(("-I", "--immediate"), "the tuner waits target.slurm.pending_s itself"),
    "--jobid": "the tuner asks for a new allocation or reuses its own",
}
#: srun options the tuner owns: one named step of its own allocation per server
_OWNED_SRUN = {
    "--jobid": "the tuner runs each server in its own allocation",
    **dict.fromkeys(("-J", "--job-name"), "the tuner names its steps to find them again"),
    **dict.fromkeys(("-N", "--nodes", "-n", "--ntasks"), "one task on one node per server"),
    **dict.fromkeys(("--gres", "-G", "--gpus"), "the step asks for target.slurm.gpus"),
    "--overlap": "a step left running would share the GPUs; the tuner stops it first instead",
    "--pty": "the server's output is its log, not a terminal",
    **dict.fromkeys(("-p", "--partition", "-A", "--account"), "the allocation's are used"),
}


class SlurmSection(Model):
    """`target.slurm`: the study's allocation (`salloc --no-shell`), one `srun` step per server."""

    partition: str
    account: str | None = None
    gpus: int = Field(ge=1, le=1024)  # GPUs per node: --gres=gpu:N
    #: the allocation's walltime as Slurm writes it (`12:00:00`, `1-00:00:00`); `12h` is turned
    #: into that form (minutes, rounded up)
    time: str
    #: more salloc options: --qos=high, --cpus-per-gpu=16, --mem=0, --constraint=h100
    options: list[str] = Field(default_factory=list)
    #: more srun options for each server's step: --container-image=... (pyxis), --cpu-bind=none
    srun_options: list[str] = Field(default_factory=list)
    job_name_prefix: str = "tuner"  # the job is PREFIX-<12 hex of the worker's marker>
    #: the allocation must be RUNNING within this, else the trial is the world's failure with
    #: Slurm's reason (squeue's %r) and the pending request is cancelled
    pending_s: Duration = 3600
    #: the longest wait between two squeue calls (allocation pending, a cancelled step's end)
    poll_s: Duration = 5

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str) -> str:
        if not PARTITION_RE.match(v):
            raise ValueError(f"{v!r} is not a partition name (or a comma-separated list of them)")
        return v

    @field_validator("account")
    @classmethod
    def _account(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_NAME_RE.match(v):
            raise ValueError(f"{v!r} is not an account name")
        return v

    @field_validator("job_name_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not SLURM_NAME_RE.match(v) or len(v) > 40:
            raise ValueError(
                f"{v!r}: letters, digits, '_', '.', '-', starting with a letter or digit, "
                "at most 40 characters"
            )
        return v

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: Any) -> str:
        return slurm_time(v)

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        return _checked(v, _OWNED_SALLOC, "salloc")

    @field_validator("srun_options")
    @classmethod
    def _srun_options(cls, v: list[str]) -> list[str]:
        return _checked(v, _OWNED_SRUN, "srun")


def slurm_time(value: Any) -> str:
    """A walltime as salloc's --time takes it: Slurm's own forms kept, `12h`/`90m` converted
    (whole minutes, rounded up); ValueError for anything else, with what to write."""
    if isinstance(value, bool) or not isinstance(value, str):
        hint = (
            " (YAML reads an unquoted 12:00:00 as a number: quote it)"
            if isinstance(value, int | float)
            else ""
        )
        raise ValueError(
            f"expected a walltime such as '12:00:00' (Slurm's --time, in quotes) or 12h, "
            f"got {value!r}{hint}"
        )
    text = value.strip()
    if _UNIT_TIME.match(text):
        minutes = math.ceil(parse_duration(text) / 60)
        days, rest = divmod(minutes, 24 * 60)
        return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"
    m = _SLURM_TIME.match(text)
    if not m or not any(int(g) for g in m.groups() if g):
        raise ValueError(
            f"expected a walltime such as '12:00:00', '1-00:00:00' (Slurm's --time) or 12h, "
            f"got {value!r}"
        )
    return text


def _checked(options: list[str], owned: Mapping[str, str], tool: str) -> list[str]:
    """The options as given, unless one is empty, the first is not an option, or the tuner
    owns it (ValueError naming it and why)."""
    for i, opt in enumerate(options):
        if not opt:
            raise ValueError("an empty argument")
        if i == 0 and not opt.startswith("-"):
            raise ValueError(f"{opt!r}: expected {tool} options (starting with -)")
        key = opt.split("=", 1)[0] if opt.startswith("--") else opt[:2]
        why = owned.get(key) if opt.startswith("-") else None
        if why:
            raise ValueError(f"{opt} is not allowed: {why}")
    return options


def slurm_problem(target: Any, server: Mapping[str, object]) -> tuple[str, str | None]:
    """(key, why not) when the rest of the study (`target`: its TargetSection, untyped here:
    config.target imports this module) cannot run with `target.slurm`, else
    ("target.slurm", None)."""
    if target.container is not None:
        return "target.slurm", (
            "cannot be combined with target.container: under Slurm a container is srun's "
            "(pyxis: --container-image=IMAGE in target.slurm.srun_options)"
        )
    if target.gpus:
        return "target.gpus", (
            "with target.slurm the step gets the allocation's GPUs (target.slurm.gpus); remove it"
        )
    if target.http_host:
        return "target.http_host", (
            "with target.slurm the tuner reaches the allocation's node through target.host; "
            "remove it"
        )
    if not target.workdir:
        return "target.workdir", (
            "target.slurm needs a directory the compute nodes share: the server runs in it "
            "and reads its secret flags' file from it"
        )
    if "host" not in server:
        return "server.host", (
            "with target.slurm the server runs on the allocation's node: set the address it "
            "listens on (0.0.0.0: reachable from the login node)"
        )
    return "target.slurm", None
