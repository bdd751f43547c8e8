"""Fake Slurm commands for tests: `salloc`, `srun`, `squeue`, `scancel`, `sinfo` on one "node",
127.0.0.1 (this machine, loopback only), the steps' tasks real local processes.

    fake = FakeSlurm(tmp_path)          # writes tmp_path/bin/{salloc,srun,squeue,scancel,sinfo}
    env PATH = fake.path                # first on the PATH of the launch script and helpers
    ... fake.calls() -> every call's argv (the command first); fake.jobs() -> id -> job record
    fake.fail_node(job_id)              # the node dies: tasks SIGKILLed, job and steps NODE_FAIL
    finally: fake.cleanup()             # SIGKILLs every task and salloc still alive, by pgid

It behaves like Slurm where the tuner depends on it:
- `salloc --no-shell` submits a job (PENDING), then is granted at once (RUNNING on 127.0.0.1)
  and exits 0, or, when the fake is told `grant=False`, waits PENDING with `reason` until the
  job is cancelled (`scancel`, or a TERM to salloc: "Job allocation J has been revoked", exit
  1); an unknown partition is refused ("invalid partition specified", exit 1).
- `srun --jobid=J --job-name=NAME ... ARGV` creates step J.S and runs ARGV as its task in a
  session of its own (outside srun's process group, as on a compute node: killing srun leaves
  it running), output to the step's log, which srun copies to its stdout; TERM/INT/HUP/CONT to
  srun reach the task; srun exits with the task's status. Without --overlap it waits while
  another step of the job runs ("Requested nodes are busy"). The task's environment is srun's
  (--export=ALL) without TUNER_SERVER_MARKER: a node's processes are not the login node's, so
  the tuner's /proc scan must not find them. A job not RUNNING: "Invalid job id specified".
- `squeue --me --noheader [--name=N] [--jobs=J] [--states=all] [--steps] --format=F` (fields
  %i %T %r %N %j %P); ended jobs only with --states=all; steps listed while their task lives.
- `scancel J` cancels a job (its tasks TERM, then KILL after 2 s), `scancel J.S` one step.
- `sinfo --noheader --partition=P --format=%P|%a|%D|%G` lists a known partition (nothing for
  an unknown one); `sinfo --version`.

The state directory holds `calls.jsonl` (one JSON line per call), `state.json` (jobs and
steps, under a lock) and `steps/J.S.log`. Only the standard library: the CLI side runs as a
plain script.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

THIS = Path(__file__).resolve()
if str(THIS.parents[2]) not in sys.path:  # run as the fake command: the helpers import
    sys.path.insert(0, str(THIS.parents[2]))

from tests.helpers.fake_bin import FakeBin, follow  # noqa: E402

NODE = "127.0.0.1"
COMMANDS = ("salloc", "srun", "squeue", "scancel", "sinfo")
MARKER_VAR = "TUNER_SERVER_MARKER"
#: job states squeue shows without --states=all
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"}
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCONT, signal.SIGUSR1)
#: srun options that take a value when given as `--opt value` (the fake accepts `--opt=value`)
_SRUN_SWITCHES = {"--overlap", "--exact", "-u", "--unbuffered", "-l", "--label", "--pty"}


# --- the test side -----------------------------------------------------------------------------


class FakeSlurm(FakeBin):
    """Slurm's commands in `root/bin`, their state in `root/state` (`calls()`: the command's
    name first)."""

    def __init__(
        self,
        root: Path,
        partitions: tuple[str, ...] = ("gpu",),
        grant: bool = True,
        reason: str = "Resources",
        gres: str = "gpu:8",
    ):
        config = {"partitions": list(partitions), "grant": grant, "reason": reason, "gres": gres}
        super().__init__(root, THIS, {cmd: cmd for cmd in COMMANDS}, "steps", config)

    def jobs(self) -> dict[str, dict]:
        return _read(self.state)["jobs"]

    def running_steps(self) -> list[str]:
        """J.S of every step whose task is alive."""
        return sorted(
            f"{j['id']}.{sid}"
            for j in self.jobs().values()
            for sid, st in j["steps"].items()
            if _task_alive(st)
        )

    def task_pids(self, step: str) -> list[int]:
        job, _, sid = step.partition(".")
        st = self.jobs()[job]["steps"][sid]
        return _session_pids(st["pid"])

    def fail_node(self, job_id: str) -> None:
        """The job's node fails: its tasks die (SIGKILL), the job and its steps NODE_FAIL."""
        with _locked(self.state):
            data = _read(self.state)
            job = data["jobs"][job_id]
            job.update(state="NODE_FAIL", reason="NodeFail")
            for st in job["steps"].values():
                if _task_alive(st):
                    st["state"] = "NODE_FAIL"
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(st["pid"], signal.SIGKILL)
            _write(self.state, data)

    def grant(self, job_id: str) -> None:
        """A pending job gets its node."""
        with _locked(self.state):
            data = _read(self.state)
            data["jobs"][job_id].update(state="RUNNING", reason="None", nodes=NODE)
            _write(self.state, data)

    def cleanup(self) -> list[str]:
        """SIGKILL every task (and waiting salloc) still alive, by its own process group;
        returns what was alive."""
        alive = []
        for job in self.jobs().values():
            for sid, st in job["steps"].items():
                if _task_alive(st):
                    alive.append(f"{job['id']}.{sid}")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(st["pid"], signal.SIGKILL)
                    _wait(lambda s=st: not _session_pids(s["pid"]), 10)
            pid = job.get("salloc_pid")
            if job["state"] == "PENDING" and pid and _stat(pid):
                alive.append(f"salloc {job['id']}")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return alive


# --- state ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    with open(state / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _read(state: Path) -> dict:
    try:
        return json.loads((state / "state.json").read_text())
    except (OSError, ValueError):
        return {"next_job": 4000, "jobs": {}}


def _write(state: Path, data: dict) -> None:
    tmp = state / f"state.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(data))
    tmp.replace(state / "state.json")


def _update(state: Path, fn: Callable[[dict], object]) -> object:
    with _locked(state):
        data = _read(state)
        out = fn(data)
        _write(state, data)
        return out


def _stat(pid: int) -> list[str] | None:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()
    except (OSError, IndexError):
        return None


def _task_alive(st: dict) -> bool:
    """The step's task runs (not a zombie, not a reused pid)."""
    s = _stat(st["pid"])
    return bool(s) and s[0] != "Z" and s[19] == st["start"]


def _session_pids(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        st = _stat(int(d.name)) if d.name.isdigit() else None
        if st and st[0] != "Z" and st[3] == str(sid):
            out.append(int(d.name))
    return out


def _wait(ok: Callable[[], bool], limit: float) -> bool:
    end = time.monotonic() + limit
    while not ok():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _opts(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """`--key=value` and bare switches up to the first argument not an option; the rest."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, eq, value = args[i].partition("=")
        opts[key] = value if eq else "true"
        i += 1
    return opts, args[i:]


# --- the CLI side --------------------------------------------------------------------------------


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _salloc(state: Path, args: list[str]) -> int:
    config = json.loads((state / "config.json").read_text())
    opts, rest = _opts(args)
    if "--no-shell" not in opts or rest:
        _say("salloc: error: the fake takes --no-shell and no command")
        return 1
    part = opts.get("--partition", "")
    if part not in config["partitions"]:
        _say(f"salloc: error: invalid partition specified: {part}")
        _say("salloc: error: Job submit/allocate failed: Invalid partition name specified")
        return 1

    def submit(data: dict) -> str:
        jid = str(data["next_job"])
        data["next_job"] += 1
        data["jobs"][jid] = {
            "id": jid,
            "name": opts.get("--job-name", "interactive"),
            "partition": part,
            "state": "PENDING",
            "reason": "None",
            "nodes": "",
            "opts": opts,
            "salloc_pid": os.getpid(),
            "next_step": 0,
            "steps": {},
        }
        return jid

    jid = str(_update(state, submit))
    _say(f"salloc: Pending job allocation {jid}")
    _say(f"salloc: job {jid} queued and waiting for resources")

    def revoke(_s: int, _f: object) -> None:
        _update(state, lambda d: d["jobs"][jid].update(state="CANCELLED", reason="None"))
        _say(f"salloc: Job allocation {jid} has been revoked.")
        sys.exit(1)

    signal.signal(signal.SIGTERM, revoke)
    signal.signal(signal.SIGINT, revoke)
    if config["grant"]:
        _update(state, lambda d: d["jobs"][jid].update(state="RUNNING", nodes=NODE))
    else:
        _update(state, lambda d: d["jobs"][jid].update(reason=config["reason"]))
    while True:
        job = _read(state)["jobs"][jid]
        if job["state"] == "RUNNING":
            _say(f"salloc: job {jid} has been allocated resources")
            _say(f"salloc: Granted job allocation {jid}")
            return 0
        if job["state"] != "PENDING":
            _say(f"salloc: Job allocation {jid} has been revoked.")
            return 1
        time.sleep(0.05)


def _srun(state: Path, args: list[str]) -> int:
    opts, cmd = _opts(args)
    jid, name = opts.get("--jobid", ""), opts.get("--job-name", "")
    unknown = [k for k in opts if not re.match(r"^--[a-z-]+$", k) and k not in _SRUN_SWITCHES]
    if unknown:
        _say(f"srun: unrecognized option '{unknown[0]}'")
        return 1
    if not cmd:
        _say("srun: fatal: No command given to execute.")
        return 1
    said_busy = False
    while True:
        with _locked(state):
            data = _read(state)
            job = data["jobs"].get(jid)
            if job is None or job["state"] != "RUNNING":
                _say(f"srun: error: Unable to create step for job {jid}: Invalid job id specified")
                return 1
            busy = any(_task_alive(st) for st in job["steps"].values())
            if not busy or "--overlap" in opts:
                sid = str(job["next_step"])
                job["next_step"] += 1
                log = state / "steps" / f"{jid}.{sid}.log"
                env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
                env.update(SLURM_JOB_ID=jid, SLURM_STEP_ID=sid, SLURMD_NODENAME=NODE)
                with open(log, "wb") as out:
                    task = subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # on the node: not in srun's group
                        env=env,
                    )
                st = _stat(task.pid)
                job["steps"][sid] = {
                    "name": name,
                    "pid": task.pid,
                    "start": st[19] if st else "",
                    "state": "RUNNING",
                    "argv": cmd,
                    "exit_code": None,
                }
                _write(state, data)
                break
        if not said_busy:
            _say(
                f"srun: Job {jid} step creation temporarily disabled, retrying (Requested nodes are busy)"
            )
            said_busy = True
        time.sleep(0.1)
    for sig in _FORWARDED:
        signal.signal(sig, lambda s, _f: _signal_task(task.pid, s))
    code = follow(log, task)

    def ended(data: dict) -> str:
        step = data["jobs"][jid]["steps"][sid]
        if step["state"] == "RUNNING":
            step["state"] = "COMPLETED" if code == 0 else "FAILED"
        step["exit_code"] = code
        return step["state"]

    final = _update(state, ended)
    if final == "NODE_FAIL":
        _say(f"srun: error: Node failure on {NODE}")
        _say("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
        _say(f"srun: error: {NODE}: task 0: Killed")
        return 1
    if final == "CANCELLED":
        _say(
            f"slurmstepd: error: *** STEP {jid}.{sid} ON {NODE} CANCELLED AT 2026-01-01T00:00:00 ***"
        )
    if code:
        _say(f"srun: error: {NODE}: task 0: Exited with exit code {code}")
    return code


def _signal_task(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _squeue(state: Path, args: list[str]) -> int:
    opts, _ = _opts(args)
    fmt = opts.get("--format", "%i %T")
    data = _read(state)
    rows = []
    if "--steps" in opts:
        for job in data["jobs"].values():
            for sid, st in job["steps"].items():
                if _task_alive(st):
                    rows.append(_fields(fmt, {"i": f"{job['id']}.{sid}", "j": st["name"]}))
    else:
        wanted = opts.get("--jobs")
        if wanted and wanted not in data["jobs"]:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        every = opts.get("--states") == "all"
        for job in data["jobs"].values():
            if wanted and job["id"] != wanted:
                continue
            if "--name" in opts and job["name"] != opts["--name"]:
                continue
            if not every and job["state"] not in LIVE:
                continue
            values = {"i": job["id"], "T": job["state"], "r": job["reason"], "N": job["nodes"]}
            values.update(j=job["name"], P=job["partition"])
            rows.append(_fields(fmt, values))
    if "--noheader" not in opts and "-h" not in opts:
        print("JOBID STATE")
    for row in rows:
        print(row)
    return 0


def _fields(fmt: str, values: dict[str, str]) -> str:
    return re.sub(r"%([a-zA-Z])", lambda m: values.get(m.group(1), ""), fmt)


def _scancel(state: Path, args: list[str]) -> int:
    rc = 0
    for target in (a for a in args if not a.startswith("-")):
        jid, _, sid = target.partition(".")
        data = _read(state)
        job = data["jobs"].get(jid)
        steps = [] if job is None else [sid] if sid else list(job["steps"])
        if job is None or (sid and sid not in job["steps"]):
            _say(f"scancel: error: Kill job error on job id {target}: Invalid job id specified")
            rc = 1
            continue
        if not sid and job["state"] not in LIVE:
            _say(
                f"scancel: error: Kill job error on job id {target}: "
                "Job/step already completing or completed"
            )
            rc = 1
            continue
        tasks = []
        with _locked(state):
            data = _read(state)
            job = data["jobs"][jid]
            if not sid:
                job.update(state="CANCELLED", reason="None")
            for s in steps:
                st = job["steps"][s]
                if _task_alive(st):
                    st["state"] = "CANCELLED"
                    tasks.append(st)
            _write(state, data)
        for st in tasks:
            _signal_task(st["pid"], signal.SIGTERM)
        for st in tasks:  # KillWait
            if not _wait(lambda s=st: not _task_alive(s), 2.0):
                _signal_task(st["pid"], signal.SIGKILL)
    return rc


def _sinfo(state: Path, args: list[str]) -> int:
    config = json.loads((state / "config.json").read_text())
    opts, _ = _opts(args)
    if "--version" in opts or "-V" in opts:
        print("slurm 24.05.0-fake")
        return 0
    fmt = opts.get("--format", "%P %a %D %G")
    wanted = opts.get("--partition")
    for i, part in enumerate(config["partitions"]):
        if wanted is None or part in wanted.split(","):
            name = part + ("*" if i == 0 else "")
            print(_fields(fmt, {"P": name, "a": "up", "D": "1", "G": config["gres"]}))
    return 0


def main(argv: list[str]) -> int:
    state = Path(argv[2])  # argv: SCRIPT --state DIR COMMAND ARGS...
    cmd, args = argv[3], argv[4:]
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps({"argv": [cmd, *args], "pid": os.getpid(), "t": time.time()}) + "\n")
    handlers = {"salloc": _salloc, "srun": _srun, "squeue": _squeue, "scancel": _scancel}
    handlers["sinfo"] = _sinfo
    return handlers[cmd](state, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
