"""A `target.slurm` study's checks on the login node: Slurm's commands on the PATH (with
target.env), and the partition (`sinfo`): it exists, is up, and its nodes have the GPUs asked.
Nothing is allocated: what the compute node holds (GPUs, RAM, the port) is not probed from the
login node, and those lines say so (`on_node`)."""

from __future__ import annotations

from tuner.check.lines import CheckLine, fail, ok, skip, warn
from tuner.check.probe import Probe, said
from tuner.config.slurm import SlurmSection
from tuner.errors import ConfigError, SetupError
from tuner.server.slurm import COMMANDS, gres_gpus, shell, sinfo_argv

#: the checks about the machine the server runs on: the allocation's node, not the login node
ON_NODE = frozenset({"gpus", "gpu processes", "host ram", "port", "http path"})


def section(p: Probe) -> SlurmSection:
    assert p.cfg.target.slurm is not None, "only planned for a target.slurm study"
    return p.cfg.target.slurm


def on_node(name: str) -> CheckLine:
    """The skip line of a check about the server's machine (the allocation's node)."""
    return skip(
        name, "on the Slurm allocation's node (target.slurm): not probed from the login node"
    )


def commands(p: Probe) -> CheckLine:
    """salloc, srun, squeue, scancel (and sinfo, for the next line) on the PATH; the version."""
    tests = "; ".join(f"command -v -- {c} >/dev/null || echo missing {c}" for c in COMMANDS)
    res = p.run_env(f"{tests}; sinfo --version 2>/dev/null || echo missing sinfo")
    missing = [w.split()[1] for w in res.stdout.splitlines() if w.startswith("missing ")]
    need = [c for c in missing if c in COMMANDS]
    if need:
        return fail(
            "slurm",
            f"{', '.join(need)} not on the PATH on {p.where} (a non-interactive shell with "
            "target.env); set target.env.PATH to Slurm's bin",
            SetupError,
        )
    version = next((ln.strip() for ln in res.stdout.splitlines() if ln.startswith("slurm")), "")
    p.facts["sinfo"] = "sinfo" not in missing
    shown = f" ({version})" if version else ""
    return ok("slurm", f"{', '.join(COMMANDS)} on the PATH{shown}")


def partition(p: Probe) -> CheckLine:
    """The partition exists (`sinfo --partition`), is up, and its nodes have the GPUs asked."""
    sec = section(p)
    if not p.facts.get("sinfo"):
        return warn("partition", f"no sinfo on {p.where}: partition {sec.partition} not checked")
    res = p.run_env(shell(sinfo_argv(sec.partition)))
    if not res.ok:
        return warn("partition", f"sinfo failed ({said(res)})")
    rows = [ln.split("|") for ln in res.stdout.splitlines() if ln.count("|") == 3]
    if not rows:
        known = p.run_env("sinfo --noheader --format=%P").stdout.split()
        shown = ", ".join(k.rstrip("*") for k in known) or "none"
        return fail(
            "partition",
            f"target.slurm.partition: no partition {sec.partition} on {p.where} (sinfo lists "
            f"{shown})",
            ConfigError,
        )
    nodes = sum(int(r[2]) for r in rows if r[2].strip().isdigit())
    up = sorted({r[1].strip() for r in rows})
    gpus = max((g for r in rows if (g := gres_gpus(r[3])) is not None), default=None)
    text = (
        f"{sec.partition}: {'/'.join(up)}, {nodes} node{'s' if nodes != 1 else ''}, "
        f"gres {', '.join(sorted({r[3].strip() for r in rows}))}"
    )
    if gpus is not None and gpus < sec.gpus:
        return fail(
            "partition",
            f"{text}: no node has the {sec.gpus} GPUs target.slurm.gpus asks",
            ConfigError,
        )
    if up != ["up"]:
        return warn("partition", f"{text}: not up; the allocation may wait")
    return ok("partition", text)
