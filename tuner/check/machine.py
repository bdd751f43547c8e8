"""The host's resources against the study: GPUs (and who holds them), host RAM for HiCache,
the model path and a speculative draft's, the server's port.

GPU probes run `nvidia-smi` in the launch's environment (its PATH is the server's), or for a
simulator launch the simulator's own (sim/smi.py: the profile's GPUs); a host without it (a CPU
box) gets a warning, not a FAIL.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from tuner.capacity import calculus as cap
from tuner.capacity.precheck import HOST_RAM_MARGIN, parse_meminfo
from tuner.check.lines import OK, CheckLine, fail, ok, skip, warn
from tuner.check.probe import Probe, said
from tuner.check.spacefacts import draft_paths, largest_parallel, model_path, values_of
from tuner.config.nodes import node_count
from tuner.errors import ConfigError, PortHeldError, SetupError

GPU_QUERY = "--query-gpu=index,name,memory.total,memory.free"
APPS_QUERY = "--query-compute-apps=pid,process_name,used_memory"
CSV = "--format=csv,noheader,nounits"
#: hardware.gpu_mem_mib may differ from nvidia-smi's total by this much before a warning
GPU_MEM_TOLERANCE = 0.01
#: a GPU with less than this share of its memory free has another tenant
GPU_FREE_WARN = 0.95
#: the exit code of the GPU probe when the host has no nvidia-smi
_NO_SMI = 3


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_mib: float
    free_mib: float


def parse_gpus(text: str) -> list[Gpu]:
    """`index, name, memory.total, memory.free` lines (nounits); malformed lines dropped."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        try:
            total, free = float(parts[-2]), float(parts[-1])
        except ValueError:  # [N/A] on some boards
            continue
        out.append(Gpu(int(parts[0]), ", ".join(parts[1:-2]), total, free))
    return out


def parse_apps(text: str) -> list[tuple[int, str, str]]:
    """`pid, process_name, used_memory` lines -> (pid, name, MiB as printed)."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            out.append((int(parts[0]), ", ".join(parts[1:-1]), parts[-1]))
    return out


def _smi(p: Probe) -> tuple[str, str]:
    """The host's nvidia-smi (the simulator's own for a simulator launch) as a quoted command,
    and its program quoted alone (for `command -v`)."""
    argv = p.launch.nvidia_smi(p.cfg.target.port)
    return shlex.join(argv), shlex.quote(argv[0])


def gpus(p: Probe) -> CheckLine:
    """GPU count, model and memory against target.gpus, TP x DP x PP and hardware.gpu_mem_mib."""
    smi, program = _smi(p)
    res = p.run_env(f"command -v {program} || exit {_NO_SMI}; {smi} {GPU_QUERY} {CSV}")
    if res.exit_code == _NO_SMI and not res.stdout.strip():
        return warn("gpus", f"no nvidia-smi on {p.where}: GPUs not checked (a CPU host?)")
    p.facts["nvidia-smi"] = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
    found = parse_gpus(res.stdout) if res.ok else []
    if not found:
        return fail("gpus", f"nvidia-smi lists no GPU on {p.where} ({said(res)})", SetupError)
    by_index = {g.index: g for g in found}
    wanted = p.cfg.target.gpus
    used = found
    if wanted:
        ids = [x.strip() for x in wanted.split(",") if x.strip()]
        if all(x.isdigit() for x in ids):
            missing = [x for x in ids if int(x) not in by_index]
            if missing:
                have = ", ".join(str(i) for i in sorted(by_index))
                return fail(
                    "gpus",
                    f"target.gpus names GPU {', '.join(missing)}; {p.where} has {have}",
                    ConfigError,
                )
            used = [by_index[int(x)] for x in ids]
    par = largest_parallel(p.cfg)
    need = max(par.gpus // node_count(p.cfg.target), 1)  # across nodes: this node's share
    if len(used) < need:
        given = "target.gpus gives" if wanted else "the host has"
        each = " on each node" if node_count(p.cfg.target) > 1 else ""
        why = f"{par.describe()} needs {need} GPUs{each}; {given} {len(used)}"
        return fail("gpus", why, ConfigError)
    names = sorted({g.name for g in used})
    total = min(g.total_mib for g in used)
    text = f"{len(used)} x {' / '.join(names)}, {total:,.0f} MiB (need {need})"
    said_mib = p.cfg.hardware.gpu_mem_mib
    if said_mib and abs(said_mib - total) > GPU_MEM_TOLERANCE * total:
        return warn(
            "gpus",
            f"{text}; hardware.gpu_mem_mib is {said_mib:,.0f}: set it to {total:.0f} "
            "(the pre-check projects pools from it)",
        )
    busy = [g for g in used if g.free_mib < GPU_FREE_WARN * g.total_mib]
    if busy:
        shown = ", ".join(f"GPU {g.index} {g.free_mib:,.0f} free" for g in busy)
        return warn("gpus", f"{text}; memory in use: {shown} (another tenant shrinks the pool)")
    if len(names) > 1:
        return warn("gpus", f"{text}: mixed models (SGLang sizes by the smallest)")
    return ok("gpus", text)


def gpu_processes(p: Probe) -> CheckLine:
    """No process holds GPU memory before the night: a leftover server ruins every trial."""
    if "nvidia-smi" not in p.facts:
        return skip("gpu processes", "no nvidia-smi")
    res = p.run_env(f"{_smi(p)[0]} {APPS_QUERY} {CSV}")
    if not res.ok:
        return warn("gpu processes", f"nvidia-smi could not list processes ({said(res)})")
    apps = parse_apps(res.stdout)
    if apps:
        shown = ", ".join(f"PID {pid} ({name}, {mib} MiB)" for pid, name, mib in apps[:5])
        return fail(
            "gpu processes",
            f"GPU memory is held by {shown}: a leftover server? stop it (kill -TERM -- -PGID "
            "of its group) or choose other GPUs with target.gpus",
            SetupError,
        )
    return ok("gpu processes", "none holds GPU memory")


def hicache_limit(available: int, total: int, ranks: int) -> int:
    """The largest whole `--hicache-size` (GB per rank) every one of `ranks` GPU ranks can
    allocate together: capacity's formula (SGLang's 10 GiB reserve) on MemAvailable less
    HOST_RAM_MARGIN."""
    return cap.max_hicache_gb_per_rank(available - HOST_RAM_MARGIN * total, ranks)


def host_ram(p: Probe) -> CheckLine:
    """Host RAM vs hardware.host_ram_gb, and the largest --hicache-size that fits the study's
    TP x DP x PP; FAIL when the study asks more. Not for tuner's simulator, whose host RAM is
    its profile's (this machine's would judge HiCache sizes the profile allows)."""
    if p.launch.simulated:
        return skip("host ram", "the simulator's host RAM is its profile's: not this machine's")
    res = p.run("cat /proc/meminfo")
    info = parse_meminfo(res.stdout) if res.ok else {}
    if "MemTotal" not in info or "MemAvailable" not in info:
        return warn("host ram", f"cannot read /proc/meminfo on {p.where} ({said(res)})")
    total, avail = info["MemTotal"], info["MemAvailable"]
    par = largest_parallel(p.cfg)
    ranks = max(par.ranks // node_count(p.cfg.target), 1)  # the ranks sharing this host's RAM
    limit = hicache_limit(avail, total, ranks)
    how = (
        f"MemAvailable {avail / cap.GB:.1f} GB less SGLang's 10 GiB reserve and a "
        f"{HOST_RAM_MARGIN:.0%} margin, for {ranks} GPU ranks ({par.describe()})"
    )
    where, sizes = values_of(p.cfg, "hicache-size")
    asked = max(sizes, default=0)
    if where and asked > limit:
        end = ".high" if where.startswith("space.") and len(sizes) == 2 else ""
        return fail(
            "host ram",
            f"{where} asks up to {asked:g} GB per rank ({asked * ranks:,.0f} GB in all); "
            f"the largest --hicache-size that fits is {limit} ({how}): lower {where}{end} to "
            f"{limit}",
            ConfigError,
        )
    text = (
        f"{total / cap.GB:.1f} GB, {avail / cap.GB:.1f} GB available; largest --hicache-size "
        f"{limit} GB per rank ({how})"
    )
    said_gb = p.cfg.hardware.host_ram_gb
    if said_gb and said_gb * cap.GB > 1.02 * avail:
        return warn(
            "host ram",
            f"{text}; hardware.host_ram_gb {said_gb:g} is more than is available: set it to "
            f"{math.floor(avail / cap.GB)} (the pre-check judges HiCache sizes by it)",
        )
    return ok("host ram", text)


def model(p: Probe) -> CheckLine:
    """server.model-path exists on the host, unless it is a hub id (downloaded at start)."""
    if p.cfg.target.container is not None:  # the path is the container's (its mounts)
        return skip("model path", "a path inside the container (target.container): not probed")
    path = model_path(p.cfg)
    if path is None:
        return skip("model path", "server.model-path is not a plain string")
    return _model_dir(p, "model path", "server.model-path", path)


def draft(p: Probe) -> CheckLine:
    """Each speculative draft model path the study can ask for (`--speculative-draft-model-path`,
    fixed or among the choices searched) exists on the host, unless it is a hub id; a draft
    SGLang takes from the model itself (an MTP head) needs none."""
    where, paths = draft_paths(p.cfg)
    if where is None:
        return skip("draft model", "no speculative draft model path in the study")
    if p.cfg.target.container is not None:
        return skip("draft model", "a path inside the container (target.container): not probed")
    lines = [_model_dir(p, "draft model", where, path) for path in paths]
    return next((line for line in lines if line.status != OK), lines[0])


def _model_dir(p: Probe, name: str, where: str, path: str) -> CheckLine:
    """A model folder on the host: OK with a config.json, a warning without, FAIL if missing
    (a hub id is downloaded at start)."""
    q = shlex.quote(path)
    res = p.run_env(
        f"if test -e {q}; then test -f {q}/config.json && echo model || echo other; "
        "else echo missing; fi",
        in_workdir=True,
    )
    state = res.stdout.strip()
    if state == "model":
        return ok(name, f"{path} holds a config.json on {p.where}")
    if state == "other":
        return warn(name, f"{path} exists on {p.where} but holds no config.json")
    if _hub_id(path):
        return ok(name, f"{path}: a hub id, downloaded at start (needs the hub or a cache)")
    return fail(
        name,
        f"{where}: {path} does not exist on {p.where} ({said(res)}); fix the path "
        "(a relative one is relative to target.workdir)",
        ConfigError,
    )


def _hub_id(path: str) -> bool:
    """`org/name`: what Hugging Face takes for a repository id, not a path."""
    parts = path.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not path.startswith((".", "~"))
        and all(c.isalnum() or c in "._-" for c in path.replace("/", ""))
    )


def port(p: Probe) -> CheckLine:
    """The server's port is free on the host (its holders named when not)."""
    assert p.host is not None
    number = p.cfg.target.port
    if p.host.port_free(number):
        return ok("port", f"{number} is free on {p.where}")
    ours = _our_strays(p)
    holders = p.host.port_holders(number)
    if holders and {pid for pid, _ in holders} <= ours:
        return warn(
            "port",
            f"{number} is held by a server an earlier `tuner tune` of this study left; "
            "tune stops it before its first trial",
        )
    from tuner.server.hostfacts import port_held_error

    return fail("port", str(port_held_error(p.host, number, lambda s: s)), PortHeldError)


def _our_strays(p: Probe) -> set[int]:
    """PIDs of servers carrying this study's marker (default worker, `--runs-dir`)."""
    from tuner.server.lifecycle import MARKER_VAR
    from tuner.study.loop import default_worker
    from tuner.study.storage import study_dir
    from tuner.study.worklock import marker_for

    assert p.host is not None
    worker = default_worker(p.cfg.target.host)
    marker = marker_for(p.cfg.study, worker, study_dir(p.cfg, p.runs_dir))
    return {
        pid
        for pgid, _ in p.host.marked_groups(MARKER_VAR, marker)
        for pid in p.host.group_pids(pgid)
    }
