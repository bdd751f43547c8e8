"""The simulated host's nvidia-smi: `python -m tuner.sim.smi [--sim-profile NAME] --sim-port PORT
[nvidia-smi's query flags]`.

The tuner reads a GPU host with nvidia-smi (server/gpus.py, server/lifecycle.py); on a launch
that runs the simulator it runs this instead (server/target.py `Launch.nvidia_smi`). It answers
the queries the tuner asks, in nvidia-smi's CSV:

    --query-gpu=index,name,memory.used,memory.total,memory.free   one row per GPU
    --query-compute-apps=pid,process_name,used_memory            one row per process on a GPU
    --format=csv[,noheader][,nounits]

The host has the profile's GPUs (its `tp` of them, or as many as the server uses). What they
hold is what the simulator serving `--sim-port` published (sim/gpustate.py): its memory plan and
the activations of its largest prefill since start or the last flush; nothing when no
simulator serves that port. An unknown field exits 2 with nvidia-smi's message.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tuner.errors import TunerError
from tuner.sim.gpustate import GpuState, read_state
from tuner.sim.profile import DEFAULT_PROFILE, Profile, load_profile

GPU_FIELDS = ("index", "name", "memory.used", "memory.total", "memory.free")
APP_FIELDS = ("pid", "process_name", "used_memory", "used_gpu_memory")
#: a field's unit, as nvidia-smi prints it in headers and values
UNITS = {"memory.used": "MiB", "memory.total": "MiB", "memory.free": "MiB"}
UNITS |= {"used_memory": "MiB", "used_gpu_memory": "MiB"}
#: the process name nvidia-smi shows for SGLang's schedulers
PROCESS_NAME = "sglang::scheduler"


class UsageError(Exception):
    """A query nvidia-smi would refuse (exit 2)."""


def answer(argv: Sequence[str], profile: Profile, state: GpuState | None) -> list[str]:
    """nvidia-smi's output lines for `argv` (its query flags) on this simulated host."""
    opts = dict(a.partition("=")[::2] for a in argv)
    unknown = set(opts) - {"--query-gpu", "--query-compute-apps", "--format"}
    if unknown or ("--query-gpu" in opts) == ("--query-compute-apps" in opts):
        raise UsageError("Invalid combination of input arguments. Please run 'nvidia-smi -h'.")
    fmt = set(opts.get("--format", "csv").split(","))
    if "csv" not in fmt:
        raise UsageError(f'"{opts.get("--format")}" is not a valid format.')
    apps = "--query-compute-apps" in opts
    fields = [f.strip() for f in opts["--query-compute-apps" if apps else "--query-gpu"].split(",")]
    known = APP_FIELDS if apps else GPU_FIELDS
    for f in fields:
        if f not in known:
            raise UsageError(f'Field "{f}" is not a valid field to query.')
    rows = _apps(profile, state) if apps else _gpus(profile, state)
    units = "nounits" not in fmt
    out = [] if "noheader" in fmt else [", ".join(_header(f, units) for f in fields)]
    out += [", ".join(_value(row[f], f, units) for f in fields) for row in rows]
    return out


def _gpus(profile: Profile, state: GpuState | None) -> list[dict[str, object]]:
    busy = state.gpus if state else 0
    total = float(profile.gpu_mem_mib)
    rows = []
    for i in range(max(profile.tp, busy)):
        used = state.used_mib if state and i < busy else 0.0
        rows.append(
            {
                "index": i,
                "name": profile.gpu_name,
                "memory.used": used,
                "memory.total": total,
                "memory.free": total - used,
            }
        )
    return rows


def _apps(profile: Profile, state: GpuState | None) -> list[dict[str, object]]:
    if state is None:
        return []
    row = {"pid": state.pid, "process_name": PROCESS_NAME, "used_memory": state.used_mib}
    return [{**row, "used_gpu_memory": state.used_mib} for _ in range(state.gpus)]


def _header(field: str, units: bool) -> str:
    unit = UNITS.get(field)
    return f"{field} [{unit}]" if unit and units else field


def _value(v: object, field: str, units: bool) -> str:
    if isinstance(v, float):
        text = f"{round(v)}"  # nvidia-smi reports whole MiB
        return f"{text} {UNITS[field]}" if units and field in UNITS else text
    return str(v)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    own = {"--sim-profile": DEFAULT_PROFILE, "--sim-port": ""}
    rest = []
    it = iter(args)
    for a in it:
        if a in own:
            own[a] = next(it, "")
        else:
            rest.append(a)
    if not own["--sim-port"].isdigit():
        print(
            "usage: python -m tuner.sim.smi [--sim-profile NAME] --sim-port PORT ...",
            file=sys.stderr,
        )
        return 2
    try:
        profile = load_profile(own["--sim-profile"])
        lines = answer(rest, profile, read_state(int(own["--sim-port"])))
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except TunerError as exc:  # a profile that does not load: one line
        print(f"tuner.sim.smi: {exc}", file=sys.stderr)
        return 2
    if lines:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
