"""Which checks run, in which order, on what each depends; the whole run, and the cheap part
`tuner tune` runs before its first trial.

A check whose prerequisite FAILed (or was skipped for that reason) is not run: its line says
which one. A check that raises a TunerError or InfraError (a dropped connection, a probe past
its deadline) is a FAIL line, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from tuner.check import connect, httppath, kube, machine, nodes, reading, sglang, slurm
from tuner.check.lines import FAIL, CheckLine, fail, skip
from tuner.check.probe import Deadlines, Probe
from tuner.config.schema import StudyConfig
from tuner.errors import ConfigError, InfraError, SetupError, TunerError
from tuner.server.target import Launch


@dataclass(frozen=True)
class Check:
    """One check: its key (what others name in `needs`), its line's name, its function."""

    key: str
    label: str
    run: Callable[[Probe], CheckLine]
    needs: tuple[str, ...] = ()


CHECKS: tuple[Check, ...] = (
    Check("ssh", "ssh", connect.connection),
    Check("shell", "shell", connect.shell, ("ssh",)),
    Check("round trip", "round trip", connect.round_trip, ("shell",)),
    Check("workdir", "workdir", connect.workdir, ("shell",)),
    Check("slurm", "slurm", slurm.commands, ("shell",)),  # target.slurm only (`planned`)
    Check("partition", "partition", slurm.partition, ("slurm",)),
    Check("kubectl", "kubectl", kube.client, ("shell",)),  # target.kubernetes only
    Check("namespace", "namespace", kube.namespace, ("kubectl",)),
    Check("pod rights", "pod rights", kube.rights, ("namespace",)),
    Check("gpu nodes", "gpu nodes", kube.nodes, ("namespace",)),
    Check("sglang", "sglang", sglang.version, ("workdir",)),
    Check("flags", "flags", sglang.flags, ("workdir",)),
    Check("gpus", "gpus", machine.gpus, ("shell",)),
    Check("gpu processes", "gpu processes", machine.gpu_processes, ("gpus",)),
    Check("host ram", "host ram", machine.host_ram, ("shell",)),
    Check("capacity", "capacity", lambda p: reading.capacity(p.cfg)),
    Check("trial time", "trial time", lambda p: reading.trial_time(p.cfg)),
    Check("model path", "model path", machine.model, ("workdir",)),
    Check("draft model", "draft model", machine.draft, ("workdir",)),
    Check("port", "port", machine.port, ("shell",)),
    Check("http path", "http path", httppath.http_path, ("port",)),
    Check("nodes", "nodes", nodes.reachable, ("shell",)),  # target.nodes only (`planned`)
    Check("node sglang", "node sglang", nodes.versions, ("nodes",)),
    Check("node gpus", "node gpus", nodes.gpus, ("nodes",)),
    Check("dist init", "dist init", nodes.dist_port, ("nodes",)),
)
#: what `tuner tune` checks before its first trial: cheap, and each a certain night-killer
NIGHT = ("ssh", "shell", "workdir", "slurm", "kubectl", "namespace", "flags", "nodes")
#: the checks of a study whose target has `slurm:`
SLURM = frozenset({"slurm", "partition"})
#: the checks of a study whose target has `kubernetes:`
KUBE = frozenset({"kubectl", "namespace", "pod rights", "gpu nodes"})


def planned(checks: tuple[Check, ...], cfg: StudyConfig | None) -> tuple[Check, ...]:
    """The checks that apply to the study (the Slurm lines only with target.slurm, the
    Kubernetes lines only with target.kubernetes)."""
    slurm_ = cfg is not None and cfg.target.slurm is not None
    kube_ = cfg is not None and cfg.target.kubernetes is not None
    nodes_ = cfg is not None and cfg.target.nodes is not None
    return tuple(
        c
        for c in checks
        if (slurm_ or c.key not in SLURM)
        and (kube_ or c.key not in KUBE)
        and (nodes_ or c.key not in nodes.KEYS)
    )


def run_checks(
    path: str | Path,
    deadlines: Deadlines | None = None,
    keys: Collection[str] | None = None,
    runs_dir: Path = Path("runs"),
) -> list[CheckLine]:
    """Every check of the study file at `path` (or those of `keys`), one line each, in order;
    `runs_dir` is the one `tuner tune` will use (which servers are its own lost ones)."""
    checks = CHECKS if keys is None else tuple(c for c in CHECKS if c.key in keys)
    line, cfg = connect.study_file(path)
    if cfg is None:
        return [
            line,
            *(skip(c.label, f"skipped: {line.name} FAILed") for c in planned(checks, cfg)),
        ]

    def on_target(cfg: StudyConfig) -> list[CheckLine]:
        probe = Probe(cfg, Launch.of(cfg.target), deadlines or Deadlines(), runs_dir=Path(runs_dir))
        try:
            return _run(planned(checks, cfg), probe)
        finally:
            if probe.host is not None:
                probe.host.close()

    if cfg.fleet is not None:  # every worker's target (check/fleet.py)
        from tuner.check.fleet import each_worker

        return [line, *each_worker(cfg, on_target)]
    return [line, *on_target(cfg)]


def _run(checks: tuple[Check, ...], probe: Probe, *, stop_at_fail: bool = False) -> list[CheckLine]:
    lines: list[CheckLine] = []
    bad: dict[str, str] = {}  # key -> the name of the line that FAILed first in its chain
    for check in checks:
        blocked = next((bad[k] for k in check.needs if k in bad), None)
        if blocked is not None:
            bad[check.key] = blocked
            lines.append(skip(check.label, f"skipped: {blocked} FAILed"))
            continue
        if check.key in slurm.ON_NODE and probe.cfg.target.slurm is not None:
            lines.append(slurm.on_node(check.label))
            continue
        if check.key in kube.ON_POD and probe.cfg.target.kubernetes is not None:
            lines.append(kube.on_pod(check.label))
            continue
        line = _one(check, probe)
        lines.append(line)
        if line.status == FAIL:
            bad[check.key] = line.name
            if stop_at_fail:
                break
    return lines


def _one(check: Check, probe: Probe) -> CheckLine:
    try:
        return check.run(probe)
    except (TunerError, InfraError) as exc:
        return fail(check.label, f"{probe.where}: {exc}", type(exc))


def before_night(cfg: StudyConfig, deadlines: Deadlines | None = None) -> None:
    """The cheap checks (SSH, the remote shell, the workdir, Slurm's commands for a Slurm
    target, the flags against the host's own SGLang), before anything is created: the first
    FAIL is raised as its one-line error (exit 2 for the user's mistakes, 1 for an unreachable
    host, as the CLI maps them)."""
    probe = Probe(cfg, Launch.of(cfg.target), deadlines or Deadlines())
    try:
        night = planned(tuple(c for c in CHECKS if c.key in NIGHT), cfg)
        lines = _run(night, probe, stop_at_fail=True)
    finally:
        if probe.host is not None:
            probe.host.close()
    failed = next((line for line in lines if line.failed), None)
    if failed is not None:
        error = failed.error or SetupError
        message = (
            f"before the first trial: {failed.name}: {failed.detail} "
            f"(`tuner check {cfg.source}` runs every check)"
        )
        if error is ConfigError:  # a key of the study file: name the file too
            raise ConfigError(message, file=cfg.source)
        raise error(message)
