"""A fake `docker` CLI for tests: no daemon, the simulator as the container's server.

    fake = FakeDocker(tmp_path)          # writes tmp_path/bin/docker
    env PATH = fake.path                 # first on the PATH of the launch script and helpers
    ... fake.calls() -> every call's argv; fake.records() -> name -> container record
    finally: fake.cleanup()              # SIGKILLs every container group it started, by pgid

It behaves like docker where the tuner depends on it:
- `run` (attached) starts the "container" in a session of its own, outside the client's process
  group, as a real container is: killing the client (SIGKILL) leaves it running; the client's
  stdout is the container's output and its exit status the container's (125 when the "daemon"
  refuses: unknown option, unknown image, a name in use; 127 when the command is not found).
  TERM/INT/HUP to the client are forwarded to the container (docker's default --sig-proxy).
  `python3 -m sglang.launch_server ARGS` inside runs `python -m tuner.sim SIM_ARGS ARGS`. The
  container's environment is the image's plus `-e` (NAME=VALUE, or NAME from the client's
  environment), never the client's; `--config PATH` must lie under a `-v` mount, else the
  "container" does not see the file.
- without `--rm` an exited container stays (`ps -a`, `inspect`, `logs`) until `rm`;
- `stop -t N` sends TERM, then KILL after N s; `rm -f` KILLs; `ps -a --filter label=K=V`,
  `container inspect -f`, `logs --tail`, `top` (host pids) answer from the state directory.

The state directory holds `calls.jsonl` (one JSON line per call), `containers/NAME.json` (the
record: pid of the container's init, its start time, status, exit code) and `NAME.log`.
Only the standard library: the CLI side runs as a plain script.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

THIS = Path(__file__).resolve()
if str(THIS.parents[2]) not in sys.path:  # run as the fake command: the helpers import
    sys.path.insert(0, str(THIS.parents[2]))

from tests.helpers.fake_bin import FakeBin, follow  # noqa: E402

REPO = THIS.parents[2]
IMAGE = "lmsysorg/sglang:fake"
SIM_ARGS = ("--sim-profile", "llama-3.1-8b-h100", "--sim-startup-seconds", "0.3")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: `docker run` options that take a value (the rest of the known ones are switches)
_VALUED = {
    *("--name", "--label", "-l", "-e", "--env", "-v", "--volume", "--gpus", "--ipc"),
    *("--network", "--net", "--shm-size", "-w", "--workdir", "-u", "--user", "--entrypoint"),
    *("--ulimit", "--cpus", "-m", "--memory", "-p", "--publish", "--device", "--stop-timeout"),
    *("--hostname", "-h", "--add-host", "--runtime", "--pull", "--cap-add", "--security-opt"),
}
_SWITCHES = {"--rm", "-i", "--interactive", "-t", "--tty", "-it", "--init", "--privileged"}
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


# --- the test side -----------------------------------------------------------------------------


class FakeDocker(FakeBin):
    """A `docker` executable in `root/bin` and its state in `root/state`."""

    def __init__(
        self, root: Path, images: tuple[str, ...] = (IMAGE,), sim_args: tuple[str, ...] = SIM_ARGS
    ):
        config = {"images": list(images), "sim_args": list(sim_args)}
        super().__init__(root, THIS, {"docker": ""}, "containers", config)

    def records(self) -> dict[str, dict]:
        """name -> record of every container that exists (running or exited)."""
        return {n: _reconciled(r) for n, r in _all(self.state).items()}

    def running(self) -> list[str]:
        return sorted(n for n, r in self.records().items() if r["status"] == "running")

    def pids(self, name: str) -> list[int]:
        """Live processes of the container (its session), e.g. the simulator."""
        rec = _load(self.state, name)
        return _session_pids(rec["pid"]) if rec else []

    def cleanup(self) -> list[str]:
        """SIGKILL every container still alive (by its own process group); their names."""
        alive = []
        for name, rec in _all(self.state).items():
            if _alive(rec):
                alive.append(name)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rec["pid"], signal.SIGKILL)
                _wait(lambda r=rec: not _session_pids(r["pid"]), 10)
        return alive


# --- state ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    with open(state / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _path(state: Path, name: str) -> Path:
    return state / "containers" / f"{name}.json"


def _load(state: Path, name: str) -> dict | None:
    try:
        return json.loads(_path(state, name).read_text())
    except (OSError, ValueError):
        return None


def _save(state: Path, rec: dict) -> None:
    tmp = _path(state, rec["name"]).with_suffix(".tmp" + secrets.token_hex(4))
    tmp.write_text(json.dumps(rec))
    tmp.replace(_path(state, rec["name"]))


def _delete(state: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _path(state, name).unlink()
    with contextlib.suppress(FileNotFoundError):
        (state / f"{name}.log").unlink()


def _all(state: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((state / "containers").glob("*.json")):
        rec = _load(state, p.stem)
        if rec:
            out[rec["name"]] = rec
    return out


def _stat(pid: int) -> list[str] | None:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()
    except (OSError, IndexError):
        return None


def _alive(rec: dict) -> bool:
    """The container's init runs (not a zombie, not a reused pid)."""
    if rec.get("status") != "running":
        return False
    st = _stat(rec["pid"])
    return bool(st) and st[0] != "Z" and st[19] == rec["start"]


def _reconciled(rec: dict) -> dict:
    """A "running" record whose init is gone without a word was killed: exited 137."""
    if rec["status"] == "running" and not _alive(rec):
        return {**rec, "status": "exited", "exit_code": rec.get("exit_code") or 137}
    return rec


def _session_pids(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        st = _stat(int(d.name)) if d.name.isdigit() else None
        if st and st[0] != "Z" and st[3] == str(sid):
            out.append(int(d.name))
    return out


def _wait(ok, limit: float) -> bool:
    end = time.monotonic() + limit
    while not ok():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


# --- the CLI side --------------------------------------------------------------------------------


def _fail(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr)
    return code


def _run(state: Path, args: list[str]) -> int:
    config = json.loads((state / "config.json").read_text())
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, eq, value = args[i].partition("=")
        if key in _VALUED:
            if not eq:
                i += 1
                if i >= len(args):
                    return _fail(f"flag needs an argument: {key}\nSee 'docker run --help'.", 125)
                value = args[i]
            opts.setdefault(key, []).append(value)
        elif key in _SWITCHES:
            opts.setdefault(key, []).append("true")
        else:
            return _fail(f"unknown flag: {key}\nSee 'docker run --help'.", 125)
        i += 1
    if i >= len(args):
        return _fail('"docker run" requires at least 1 argument.', 125)
    image, inner = args[i], args[i + 1 :]
    name = (opts.get("--name") or [f"fake_{secrets.token_hex(4)}"])[-1]
    if image not in config["images"]:
        print(f"Unable to find image '{image}' locally", file=sys.stderr)
        return _fail(
            f"docker: Error response from daemon: pull access denied for {image.split(':')[0]}, "
            "repository does not exist or may require 'docker login'.",
            125,
        )
    labels = dict(v.partition("=")[::2] for v in opts.get("--label", []) + opts.get("-l", []))
    mounts = [v.split(":") for v in opts.get("-v", []) + opts.get("--volume", [])]
    env = {"PATH": CONTAINER_PATH, "HOME": str(state), "HOSTNAME": name, "PYTHONPATH": str(REPO)}
    for e in opts.get("-e", []) + opts.get("--env", []):
        key, eq, value = e.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:  # `-e NAME`: the client's value, when it has one
            env[key] = os.environ[key]
    cmd = list(inner)
    if _server_command(cmd):
        cmd = [sys.executable, "-m", "tuner.sim", *config["sim_args"], *cmd[3:]]
    elif not cmd or shutil.which(cmd[0], path=CONTAINER_PATH) is None:
        exe = cmd[0] if cmd else ""
        return _fail(
            "docker: Error response from daemon: failed to create task for container: "
            f'OCI runtime create failed: exec: "{exe}": executable file not found in $PATH: '
            "unknown.",
            127,
        )
    for j in range(1, len(cmd)):  # the container sees host files only through its mounts
        if cmd[j - 1] == "--config" and cmd[j].startswith("/"):
            hit = next((m for m in mounts if cmd[j] == m[1] or cmd[j].startswith(m[1] + "/")), None)
            cmd[j] = hit[0] + cmd[j][len(hit[1]) :] if hit else "/not-in-the-container" + cmd[j]
    log = state / f"{name}.log"
    with _locked(state):
        if _load(state, name) is not None:
            return _fail(
                f'docker: Error response from daemon: Conflict. The container name "/{name}" is '
                "already in use. You have to remove (or rename) that container to be able to "
                "reuse that name.",
                125,
            )
        with open(log, "wb") as out:
            init = subprocess.Popen(
                [sys.executable, str(THIS), "--state", str(state), "_init", name, "--", *cmd],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outside the client's group, as a container is
                env=env,
                cwd="/",
            )
        st = _stat(init.pid)
        rec = {
            "name": name,
            "id": secrets.token_hex(32),
            "image": image,
            "labels": labels,
            "mounts": [":".join(m) for m in mounts],
            "env": sorted(env),
            "argv": list(inner),
            "cmd": cmd,
            "pid": init.pid,
            "start": st[19] if st else "",
            "status": "running",
            "exit_code": None,
            "rm": "--rm" in opts,
        }
        _save(state, rec)
    for sig in _FORWARDED:  # --sig-proxy
        signal.signal(sig, lambda s, _f: os.kill(init.pid, s))
    code = follow(log, init)
    with _locked(state):
        cur = _load(state, name)
        if cur and cur["pid"] == init.pid:
            if cur["status"] == "running":
                _save(state, {**cur, "status": "exited", "exit_code": code})
            if cur["rm"]:
                _delete(state, name)
    return code


def _server_command(cmd: list[str]) -> bool:
    """`python3 -m sglang.launch_server` (or any python, or `-m tuner.sim`): the simulator."""
    return (
        len(cmd) >= 3
        and os.path.basename(cmd[0]).startswith("python")
        and cmd[1] == "-m"
        and cmd[2] in ("sglang.launch_server", "tuner.sim")
    )


def _init(state: Path, name: str, cmd: list[str]) -> int:
    """The container's PID 1: runs the command, forwards signals, records the exit code."""
    child = subprocess.Popen(cmd)
    for sig in _FORWARDED:
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    code = code if code >= 0 else 128 - code
    with _locked(state):
        rec = _load(state, name)
        if rec and rec["pid"] == os.getpid() and rec["status"] == "running":
            _save(state, {**rec, "status": "exited", "exit_code": code})
    return code


def _stop(state: Path, args: list[str]) -> int:
    wait_s, names, rc = 10.0, [], 0
    it = iter(args)
    for a in it:
        if a in ("-t", "--time", "--timeout", "-s", "--signal"):
            value = next(it, "10")
            wait_s = float(value) if a != "-s" and a != "--signal" else wait_s
        elif a.startswith(("--time=", "--timeout=")):
            wait_s = float(a.partition("=")[2])
        else:
            names.append(a)
    for name in names:
        rec = _load(state, name)
        if rec is None:
            rc = _fail(f"Error response from daemon: No such container: {name}")
            continue
        if _alive(rec):
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec["pid"], signal.SIGTERM)
            if not _wait(lambda r=rec: not _alive(r), wait_s):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rec["pid"], signal.SIGKILL)
            _wait(lambda r=rec: not _session_pids(r["pid"]), 10)
        with _locked(state):
            cur = _load(state, name)
            if cur:
                _save(state, _reconciled(cur))
        print(name)
    return rc


def _rm(state: Path, args: list[str]) -> int:
    force = any(a in ("-f", "--force") or (a.startswith("-") and "f" in a) for a in args)
    rc = 0
    for name in (a for a in args if not a.startswith("-")):
        rec = _load(state, name)
        if rec is None:
            if not force:  # docker 20.10+: `rm -f` of a missing container succeeds
                rc = _fail(f"Error response from daemon: No such container: {name}")
            continue
        if _alive(rec):
            if not force:
                rc = _fail(
                    f'Error response from daemon: cannot remove container "/{name}": container '
                    "is running: stop the container before removing or force remove"
                )
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rec["pid"], signal.SIGKILL)
        _wait(lambda r=rec: not _session_pids(r["pid"]), 10)
        with _locked(state):
            _delete(state, name)
        print(name)
    return rc


def _kill(state: Path, args: list[str]) -> int:
    sig, names = "KILL", []
    it = iter(args)
    for a in it:
        if a in ("-s", "--signal"):
            sig = next(it, "KILL")
        else:
            names.append(a)
    rc = 0
    for name in names:
        rec = _load(state, name)
        if rec is None or not _alive(rec):
            rc = _fail(f"Error response from daemon: container {name} is not running")
            continue
        num = getattr(signal, "SIG" + sig.removeprefix("SIG").upper())
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if num == signal.SIGKILL else os.kill)(rec["pid"], num)
        print(name)
    return rc


def _view(rec: dict) -> dict:
    """The record as `inspect` and `ps --format` see it."""
    rec = _reconciled(rec)
    running = rec["status"] == "running"
    code = rec.get("exit_code") or 0
    return {
        "ID": rec["id"][:12],
        "Id": rec["id"],
        "Name": "/" + rec["name"],
        "Names": rec["name"],
        "Image": rec["image"],
        "State": {
            "Status": rec["status"],
            "Running": running,
            "ExitCode": code,
            "Pid": rec["pid"] if running else 0,
        },
        "Status": "Up" if running else f"Exited ({code})",
        "Labels": ",".join(f"{k}={v}" for k, v in rec["labels"].items()),
        "Config": {"Image": rec["image"], "Labels": rec["labels"], "Env": rec["env"]},
    }


def _template(fmt: str, view: dict) -> str:
    def field(m: re.Match) -> str:
        value: object = view
        for part in m.group(2).split("."):
            value = value.get(part, "<no value>") if isinstance(value, dict) else "<no value>"
        return json.dumps(value) if m.group(1) else str(value)

    return re.sub(r"\{\{\s*(json\s+)?\.([A-Za-z.]+)\s*\}\}", field, fmt)


def _ps(state: Path, args: list[str]) -> int:
    every, fmt, filters = False, None, []
    it = iter(args)
    for a in it:
        if a in ("-a", "--all"):
            every = True
        elif a in ("-f", "--filter"):
            filters.append(next(it, ""))
        elif a == "--format":
            fmt = next(it, "")
        elif a in ("-q", "--quiet"):
            fmt = "{{.ID}}"
    lines = [] if fmt else ["CONTAINER ID   IMAGE   STATUS   NAMES"]
    for rec in _all(state).values():
        view = _view(rec)
        if not every and view["State"]["Status"] != "running":
            continue
        ok = True
        for f in filters:
            key, _, value = f.partition("=")
            if key == "label":
                k, eq, v = value.partition("=")
                ok &= k in rec["labels"] and (not eq or rec["labels"][k] == v)
            elif key == "name":
                ok &= value in rec["name"]
            elif key == "status":
                ok &= view["State"]["Status"] == value
        if ok:
            lines.append(
                _template(fmt, view)
                if fmt
                else f"{view['ID']}   {rec['image']}   {view['Status']}   {rec['name']}"
            )
    print("\n".join(lines)) if lines else None
    return 0


def _inspect(state: Path, args: list[str], what: str) -> int:
    fmt, names = None, []
    it = iter(args)
    for a in it:
        if a in ("-f", "--format"):
            fmt = next(it, "")
        elif a.startswith("--format="):
            fmt = a.partition("=")[2]
        else:
            names.append(a)
    rc, out = 0, []
    for name in names:
        rec = _load(state, name)
        if rec is None:
            rc = _fail(f"Error: No such {what}: {name}")
            continue
        out.append(_template(fmt, _view(rec)) if fmt else json.dumps([_view(rec)], indent=2))
    if out:
        print("\n".join(out))
    return rc


def _logs(state: Path, args: list[str]) -> int:
    tail, names = None, []
    it = iter(args)
    for a in it:
        if a in ("--tail", "-n"):
            value = next(it, "all")
            tail = None if value == "all" else int(value)
        elif not a.startswith("-"):
            names.append(a)
    if not names or _load(state, names[0]) is None:
        return _fail(f"Error response from daemon: No such container: {names[0] if names else ''}")
    lines = (state / f"{names[0]}.log").read_bytes().decode(errors="replace").splitlines()
    for ln in lines if tail is None else lines[len(lines) - tail :] if tail > 0 else []:
        print(ln)
    return 0


def _top(state: Path, args: list[str]) -> int:
    rec = _load(state, args[0]) if args else None
    if rec is None:
        return _fail(f"Error response from daemon: No such container: {args[0] if args else ''}")
    if not _alive(rec):
        return _fail(f"Error response from daemon: container {args[0]} is not running")
    print("PID")
    for pid in sorted(_session_pids(rec["pid"])):
        print(pid)
    return 0


def main(argv: list[str]) -> int:
    state = Path(argv[2])  # argv: SCRIPT --state DIR ARGS...
    args = argv[3:]
    if args[:1] == ["_init"]:
        return _init(state, args[1], args[3:])
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps({"argv": args, "pid": os.getpid(), "t": time.time()}) + "\n")
    what = "container" if args[:1] == ["container"] else "object"
    if args[:1] == ["container"]:
        args = args[1:]
    cmd, rest = (args[0], args[1:]) if args else ("", [])
    handlers = {"run": _run, "stop": _stop, "rm": _rm, "kill": _kill, "ps": _ps, "logs": _logs}
    handlers["top"] = _top
    if cmd in handlers:
        return handlers[cmd](state, rest)
    if cmd == "inspect":
        return _inspect(state, rest, what)
    if cmd in ("version", "--version"):
        print("Docker version 99.0.0-fake")
        return 0
    return _fail(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
