"""A fake `kubectl` for tests: no cluster, the simulator as each pod's server, run on this machine.

    fake = FakeKubectl(tmp_path, nodes=[node("gpu-1", gpus=1)])   # writes tmp_path/bin/kubectl
    env PATH = fake.path                  # first on the PATH of the tuner's kubectl calls
    ... fake.calls() -> every call's argv; fake.pods() -> name -> pod JSON as `get` shows it
    fake.evict(name)                      # the kubelet evicts the pod (its process is killed)
    finally: fake.cleanup()               # SIGKILLs every pod process still alive, by pgid

It behaves like kubectl against a one-namespace cluster where the tuner depends on it:
- `create -f -` (a JSON List or one object on stdin; `-o name` prints `pod/NAME`): Secrets are
  stored; a pod is scheduled at once on the first node that matches its nodeSelector and has
  the GPUs its container asks for (GPUs of pods still running are taken), else it stays
  Pending with PodScheduled False, reason Unschedulable and the scheduler's message
  ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."), and is scheduled by a later
  call once GPUs are free. A scheduled pod whose image is unknown waits in ErrImagePull; one
  whose Secret is missing in CreateContainerConfigError. Otherwise its container runs in a
  session of its own (never in the caller's group, as a pod is not): `python3 -m
  sglang.launch_server ARGS` runs `python -m tuner.sim SIM_ARGS ARGS`; its environment is the
  image's plus the pod's `env` (values, or a Secret's key); a Secret volume's files are written
  to the state directory and `--config PATH` under its mountPath points there.
- `get pod NAME|pods -l SEL|pods,secrets -l SEL -o json`, `get namespace NS -o name`, `get nodes
  [-l SEL] -o json`; a pod whose process ended shows Succeeded/Failed with the exit code.
- `delete pod/NAME secret/NAME | pods,secrets -l SEL [--ignore-not-found] [--wait] [--timeout]`:
  TERM, then KILL after terminationGracePeriodSeconds; the object is gone when it returns.
- `logs [-f] [--tail=N] pod/NAME [-c C]`: a container not started is "waiting to start".
- `port-forward --address 127.0.0.1 pod/NAME LOCAL:REMOTE`: a real TCP relay from
  127.0.0.1:LOCAL to 127.0.0.1:REMOTE (the "pod's" loopback is this machine's), "Forwarding
  from ..." once it listens; refused for a pod not Running; it ends when the pod stops running.
- `auth can-i VERB RESOURCE` (yes, unless the test denied it), `version --client`.
- a LeaderWorkerSet (`create`, `get leaderworkersets -l SEL`, `delete leaderworkerset/NAME`):
  the controller's part is played at once: `size` pods from the leader and worker templates,
  named as LWS names them (`NAME-0` the leader, `NAME-0-1` ... the workers), labelled
  `leaderworkerset.sigs.k8s.io/name` and `/worker-index`, with LWS_LEADER_ADDRESS (127.0.0.1:
  the fake's pods share this machine's loopback, where a real one is `NAME-0.NAME.NS`),
  LWS_GROUP_SIZE and LWS_WORKER_INDEX in their env, which `$(VAR)` in args expands as the
  kubelet does. A worker's `--port` is moved to a free one (a real pod has its own loopback;
  here the leader's port is taken). Deleting the set deletes its pods.

The state directory holds `calls.jsonl`, `pods/NAME.json` (the manifest, the node, the process,
its exit code), `pods/NAME.log`, `secrets/NAME.json`. Only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

THIS = Path(__file__).resolve()
if str(THIS.parents[2]) not in sys.path:  # run as the fake command: the helpers import
    sys.path.insert(0, str(THIS.parents[2]))

from tests.helpers.fake_bin import FakeBin  # noqa: E402
from tests.helpers.fake_docker import _locked, _session_pids, _stat, _wait  # noqa: E402

REPO = THIS.parents[2]
IMAGE = "lmsysorg/sglang:fake"
SIM_ARGS = ("--sim-profile", "llama-3.1-8b-h100", "--sim-startup-seconds", "0.3")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RESOURCE = "nvidia.com/gpu"


def node(name: str, gpus: int = 1, labels: dict[str, str] | None = None) -> dict:
    """A node of the fake cluster."""
    return {"name": name, "gpus": gpus, "labels": labels or {}}


# --- the test side -----------------------------------------------------------------------------


class FakeKubectl(FakeBin):
    """A `kubectl` executable in `root/bin` and its state in `root/state`."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: list[dict] | None = None,
        namespaces: tuple[str, ...] = ("default", "llm"),
        images: tuple[str, ...] = (IMAGE,),
        sim_args: tuple[str, ...] = SIM_ARGS,
        denied: tuple[str, ...] = (),
    ):
        config = {
            "nodes": nodes if nodes is not None else [node("gpu-1")],
            "namespaces": list(namespaces),
            "images": list(images),
            "sim_args": list(sim_args),
            "denied": list(denied),  # "VERB RESOURCE", e.g. "list nodes"
        }
        super().__init__(root, THIS, {"kubectl": ""}, "pods", config)
        (self.state / "secrets").mkdir(exist_ok=True)
        (self.state / "lws").mkdir(exist_ok=True)

    def pods(self) -> dict[str, dict]:
        """name -> the pod as `get -o json` shows it."""
        return {n: _view(self.state, r) for n, r in _records(self.state).items()}

    def secrets(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in (self.state / "secrets").glob("*.json")}

    def pod_pids(self, name: str) -> list[int]:
        rec = _load(self.state, name)
        return _session_pids(rec["pid"]) if rec and rec.get("pid") else []

    def evict(self, name: str, message: str = "The node was low on resource: memory.") -> None:
        """The kubelet evicts the pod: Failed, reason Evicted; its processes are killed."""
        with _locked(self.state):
            rec = _load(self.state, name)
            assert rec is not None, name
            rec["evicted"] = {"reason": "Evicted", "message": message}
            _save(self.state, rec)
        _kill(rec)

    def cleanup(self) -> list[str]:
        """SIGKILL every pod process still alive (by its own process group); their pods."""
        alive = []
        for name, rec in _records(self.state).items():
            if rec.get("pid") and _session_pids(rec["pid"]):
                alive.append(name)
                _kill(rec)
        return alive


# --- state ---------------------------------------------------------------------------------------


def _path(state: Path, name: str) -> Path:
    return state / "pods" / f"{name}.json"


def _load(state: Path, name: str) -> dict | None:
    try:
        return json.loads(_path(state, name).read_text())
    except (OSError, ValueError):
        return None


def _save(state: Path, rec: dict) -> None:
    tmp = _path(state, rec["name"]).with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(rec))
    tmp.replace(_path(state, rec["name"]))


def _records(state: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((state / "pods").glob("*.json")):
        rec = _load(state, p.stem)
        if rec:
            out[rec["name"]] = rec
    return out


def _config(state: Path) -> dict:
    return json.loads((state / "config.json").read_text())


def _alive(rec: dict) -> bool:
    st = _stat(rec["pid"]) if rec.get("pid") else None
    return bool(st) and st[0] != "Z" and st[19] == rec["start"]


def _kill(rec: dict) -> None:
    if rec.get("pid"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec["pid"], signal.SIGKILL)
        _wait(lambda: not _session_pids(rec["pid"]), 10)


def _running(rec: dict) -> bool:
    return (
        bool(rec.get("pid"))
        and rec.get("exit_code") is None
        and not rec.get("evicted")
        and _alive(rec)
    )


def _gpus(pod: dict) -> int:
    c = pod["spec"]["containers"][0]
    return int(((c.get("resources") or {}).get("limits") or {}).get(RESOURCE, 0))


def _view(state: Path, rec: dict) -> dict:
    """The pod as `kubectl get pod -o json` shows it."""
    pod = json.loads(json.dumps(rec["pod"]))
    cname = pod["spec"]["containers"][0]["name"]
    status: dict = {"phase": "Pending", "conditions": []}
    if rec.get("node") is None:
        status["conditions"].append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": rec.get("why", ""),
            }
        )
    else:
        pod["spec"]["nodeName"] = rec["node"]
        status["conditions"].append({"type": "PodScheduled", "status": "True"})
        if rec.get("waiting"):
            state_ = {"waiting": rec["waiting"]}
        elif rec.get("pid") and (_alive(rec) and rec.get("exit_code") is None):
            state_ = {"running": {"startedAt": rec["started_at"]}}
            status["phase"] = "Running"
        else:
            code = rec.get("exit_code")
            code = 137 if code is None else code
            state_ = {
                "terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
            }
            status["phase"] = "Succeeded" if code == 0 else "Failed"
        if rec.get("evicted"):
            status.update(phase="Failed", **rec["evicted"])
            state_ = {"terminated": {"exitCode": 137, "reason": "Error"}}
        status["containerStatuses"] = [{"name": cname, "state": state_}]
    pod["status"] = status
    return pod


# --- the CLI side --------------------------------------------------------------------------------


def _fail(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr)
    return code


def _denied(state: Path, verb: str, resource: str) -> bool:
    return f"{verb} {resource}" in _config(state)["denied"]


def _forbidden(verb: str, resource: str, ns: str) -> int:
    return _fail(
        f'Error from server (Forbidden): {resource} is forbidden: User "fake" cannot {verb} '
        f'resource "{resource}" in API group "" in the namespace "{ns}"'
    )


def _schedule(state: Path, rec: dict) -> None:
    """Place a pending pod on a node, and start it (rec is changed and saved)."""
    config = _config(state)
    pod = rec["pod"]
    want = _gpus(pod)
    selector = pod["spec"].get("nodeSelector") or {}
    used: dict[str, int] = {}
    for other in _records(state).values():
        if (
            other["name"] != rec["name"]
            and other.get("node")
            and (_running(other) or other.get("waiting"))
        ):
            used[other["node"]] = used.get(other["node"], 0) + _gpus(other["pod"])
    nodes = config["nodes"]
    unmatched = [n for n in nodes if any(n["labels"].get(k) != v for k, v in selector.items())]
    short = [n for n in nodes if n not in unmatched and n["gpus"] - used.get(n["name"], 0) < want]
    fit = [n for n in nodes if n not in unmatched and n not in short]
    if not fit:
        parts = []
        if short:
            parts.append(f"{len(short)} Insufficient {RESOURCE}")
        if unmatched:
            parts.append(f"{len(unmatched)} node(s) didn't match Pod's node affinity/selector")
        rec["why"] = f"0/{len(nodes)} nodes are available: {', '.join(parts)}."
        _save(state, rec)
        return
    rec["node"] = fit[0]["name"]
    _start(state, rec, config)


def _start(state: Path, rec: dict, config: dict) -> None:
    pod = rec["pod"]
    c = pod["spec"]["containers"][0]
    if c["image"] not in config["images"]:
        rec["waiting"] = {
            "reason": "ErrImagePull",
            "message": f"rpc error: pull access denied for {c['image']}, repository does not exist",
        }
        _save(state, rec)
        return
    env = {
        "PATH": CONTAINER_PATH,
        "HOME": "/root",
        "HOSTNAME": rec["name"],
        "PYTHONPATH": str(REPO),
    }
    files = state / "pods" / f"{rec['name']}.files"
    mounts: dict[str, Path] = {}
    vols = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        vol = vols.get(m["name"], {})
        if "secret" in vol:
            secret = _secret(state, vol["secret"]["secretName"])
            if secret is None:
                rec["waiting"] = {"reason": "ContainerCreating", "message": "secret not found"}
                _save(state, rec)
                return
            where = files / m["name"]
            where.mkdir(parents=True, exist_ok=True)
            for key, text in secret["stringData"].items():
                (where / key).write_text(text)
                (where / key).chmod(0o600)
            mounts[m["mountPath"]] = where
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            secret = _secret(state, ref["name"])
            if secret is None or ref["key"] not in secret["stringData"]:
                rec["waiting"] = {
                    "reason": "CreateContainerConfigError",
                    "message": f'secret "{ref["name"]}" not found',
                }
                _save(state, rec)
                return
            env[e["name"]] = secret["stringData"][ref["key"]]
    cmd = [_expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
    if env.get("LWS_WORKER_INDEX", "0") != "0":  # the leader's port is taken on this loopback
        for j in range(1, len(cmd)):
            if cmd[j - 1] == "--port":
                cmd[j] = str(_free_port())
    if (
        len(cmd) >= 3
        and os.path.basename(cmd[0]).startswith("python")
        and cmd[1:3] == ["-m", "sglang.launch_server"]
    ):
        cmd = [sys.executable, "-m", "tuner.sim", *config["sim_args"], *cmd[3:]]
    for j in range(1, len(cmd)):  # the pod sees its Secret's files at their mountPath
        if cmd[j - 1] == "--config":
            hit = next((d for d in mounts if cmd[j].startswith(d + "/")), None)
            cmd[j] = str(mounts[hit]) + cmd[j][len(hit) :] if hit else "/not-in-the-pod" + cmd[j]
    with open(state / "pods" / f"{rec['name']}.log", "wb") as out:
        init = subprocess.Popen(
            [sys.executable, str(THIS), "--state", str(state), "_init", rec["name"], "--", *cmd],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the caller's group: a pod is elsewhere
            env=env,
            cwd="/",
        )
    st = _stat(init.pid)
    rec.update(pid=init.pid, start=st[19] if st else "", started_at=time.time(), argv=cmd)
    rec["env"] = sorted(env)
    _save(state, rec)


def _expand(arg: str, env: dict[str, str]) -> str:
    """`$(VAR)` replaced by the container's variable, as the kubelet does (unknown: kept)."""
    for k, v in env.items():
        arg = arg.replace(f"$({k})", v)
    return arg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _lws_pods(lws: dict) -> list[dict]:
    """The pods the LWS controller makes for a set of one group."""
    name, ns = lws["metadata"]["name"], lws["metadata"].get("namespace", "default")
    tpl = lws["spec"]["leaderWorkerTemplate"]
    size = int(tpl.get("size", 1))
    out = []
    for i in range(size):
        t = json.loads(json.dumps(tpl.get("leaderTemplate") if i == 0 else tpl["workerTemplate"]))
        t = t or json.loads(json.dumps(tpl["workerTemplate"]))
        meta = t.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), LWS_NAME: name, LWS_INDEX: str(i)}
        for c in t["spec"]["containers"]:
            c["env"] = [
                {"name": "LWS_LEADER_ADDRESS", "value": "127.0.0.1"},
                {"name": "LWS_GROUP_SIZE", "value": str(size)},
                {"name": "LWS_WORKER_INDEX", "value": str(i)},
                *(c.get("env") or []),
            ]
        pod_name = f"{name}-0" if i == 0 else f"{name}-0-{i}"
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {**meta, "name": pod_name, "namespace": ns, "labels": labels},
                "spec": t["spec"],
            }
        )
    return out


def _secret(state: Path, name: str) -> dict | None:
    try:
        return json.loads((state / "secrets" / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def _init(state: Path, name: str, cmd: list[str]) -> int:
    """The pod's container: runs the command, forwards TERM, records the exit code."""
    child = subprocess.Popen(cmd)
    signal.signal(signal.SIGTERM, lambda s, _f: child.send_signal(s))
    code = child.wait()
    code = code if code >= 0 else 128 - code
    with _locked(state):
        rec = _load(state, name)
        if rec and rec.get("pid") == os.getpid():
            rec["exit_code"] = code
            _save(state, rec)
    return code


def _create(state: Path, ns: str, args: list[str]) -> int:
    config = _config(state)
    data = json.loads(sys.stdin.read())
    objs = data["items"] if data.get("kind") == "List" else [data]
    if ns not in config["namespaces"]:
        return _fail(f'Error from server (NotFound): namespaces "{ns}" not found')
    for obj in objs:
        kind, name = obj["kind"], obj["metadata"]["name"]
        resource = {"Pod": "pods", "Secret": "secrets", "LeaderWorkerSet": "leaderworkersets"}[kind]
        if _denied(state, "create", resource):
            return _forbidden("create", resource, ns)
        with _locked(state):
            if kind == "Secret":
                path = state / "secrets" / f"{name}.json"
                if path.exists():
                    return _fail(
                        f'Error from server (AlreadyExists): secrets "{name}" already exists'
                    )
                path.write_text(json.dumps(obj))
                path.chmod(0o600)
            elif kind == "LeaderWorkerSet":
                path = state / "lws" / f"{name}.json"
                if path.exists():
                    return _fail(
                        f"Error from server (AlreadyExists): leaderworkersets.leaderworkerset"
                        f'.x-k8s.io "{name}" already exists'
                    )
                path.write_text(json.dumps(obj))
                for pod in _lws_pods(obj):
                    rec = {"name": pod["metadata"]["name"], "pod": pod, "node": None, "pid": None}
                    rec["exit_code"] = None
                    _save(state, rec)
                    _schedule(state, rec)
            else:
                if _load(state, name) is not None:
                    return _fail(f'Error from server (AlreadyExists): pods "{name}" already exists')
                rec = {"name": name, "pod": obj, "node": None, "pid": None, "exit_code": None}
                _save(state, rec)
                _schedule(state, rec)
        shown = "leaderworkerset.leaderworkerset.x-k8s.io" if kind == "LeaderWorkerSet" else kind
        shown = shown.lower()
        print(f"{shown}/{name}" if "name" in args else f"{shown}/{name} created")
    return 0


def _reschedule(state: Path) -> None:
    """The scheduler's next pass: pending pods placed where GPUs came free."""
    with _locked(state):
        for rec in _records(state).values():
            if rec.get("node") is None:
                _schedule(state, rec)


def _matches(labels: dict, sel: str | None) -> bool:
    if not sel:
        return True
    return all(labels.get(k) == v for k, _, v in (p.partition("=") for p in sel.split(",")))


def _get(state: Path, ns: str, args: list[str]) -> int:
    sel = _opt(args, "-l") or _opt(args, "--selector")
    words = _positional(args)
    what = words[0] if words else ""
    if what in ("namespace", "namespaces", "ns"):
        name = words[1] if len(words) > 1 else ""
        if name not in _config(state)["namespaces"]:
            return _fail(f'Error from server (NotFound): namespaces "{name}" not found')
        print(f"namespace/{name}")
        return 0
    if what in ("nodes", "node"):
        if _denied(state, "list", "nodes"):
            return _fail(
                'Error from server (Forbidden): nodes is forbidden: User "fake" cannot list '
                'resource "nodes" in API group "" at the cluster scope'
            )
        out = []
        for n in _config(state)["nodes"]:
            if _matches(n["labels"], sel):
                out.append(
                    {
                        "kind": "Node",
                        "metadata": {"name": n["name"], "labels": n["labels"]},
                        "spec": {},
                        "status": {"allocatable": {RESOURCE: str(n["gpus"]), "cpu": "64"}},
                    }
                )
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": out}))
        return 0
    _reschedule(state)
    kinds = what.split(",")
    if len(words) > 1:  # one pod by name
        rec = _load(state, words[1])
        if rec is None or rec["pod"]["metadata"].get("namespace", "default") != ns:
            return _fail(f'Error from server (NotFound): pods "{words[1]}" not found')
        print(json.dumps(_view(state, rec)))
        return 0
    out = []
    if {"leaderworkersets", "leaderworkerset", "lws"} & set(kinds):
        for p in sorted((state / "lws").glob("*.json")):
            lws = json.loads(p.read_text())
            if _matches(lws["metadata"].get("labels", {}), sel):
                out.append(lws)
    if {"pods", "pod", "po"} & set(kinds):
        out += [
            _view(state, r)
            for r in _records(state).values()
            if _matches(r["pod"]["metadata"].get("labels", {}), sel)
        ]
    if {"secrets", "secret"} & set(kinds):
        for p in sorted((state / "secrets").glob("*.json")):
            s = json.loads(p.read_text())
            if _matches(s["metadata"].get("labels", {}), sel):
                out.append({k: v for k, v in s.items() if k != "stringData"})
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": out}))
    return 0


def _delete(state: Path, ns: str, args: list[str]) -> int:
    sel = _opt(args, "-l") or _opt(args, "--selector")
    ignore = "--ignore-not-found" in args or "--ignore-not-found=true" in args
    words = _positional(args)
    targets: list[tuple[str, str]] = []
    if sel:
        kinds = words[0].split(",") if words else []
        if {"leaderworkersets", "leaderworkerset", "lws"} & set(kinds):
            for p in sorted((state / "lws").glob("*.json")):
                if _matches(json.loads(p.read_text())["metadata"].get("labels", {}), sel):
                    targets.append(("leaderworkerset", p.stem))
        if {"pods", "pod"} & set(kinds):
            targets += [
                ("pod", n)
                for n, r in _records(state).items()
                if _matches(r["pod"]["metadata"].get("labels", {}), sel)
            ]
        if {"secrets", "secret"} & set(kinds):
            for p in sorted((state / "secrets").glob("*.json")):
                if _matches(json.loads(p.read_text())["metadata"].get("labels", {}), sel):
                    targets.append(("secret", p.stem))
    else:
        targets = [tuple(w.split("/", 1)) for w in words]  # type: ignore[misc]
    rc = 0
    for kind, name in targets:
        kind = "leaderworkerset" if kind.startswith("leaderworkerset") else kind
        if _denied(state, "delete", kind + "s"):
            return _forbidden("delete", kind + "s", ns)
        if kind == "leaderworkerset":
            path = state / "lws" / f"{name}.json"
            if not path.exists():
                rc = rc if ignore else _fail(f'Error from server (NotFound): "{name}" not found')
                continue
            for pod, rec in _records(state).items():  # the controller's pods go first
                if rec["pod"]["metadata"].get("labels", {}).get(LWS_NAME) == name:
                    _delete_pod(state, pod)
            path.unlink()
            print(f'leaderworkerset.leaderworkerset.x-k8s.io "{name}" deleted')
            continue
        if kind == "secret":
            path = state / "secrets" / f"{name}.json"
            if not path.exists():
                rc = (
                    rc
                    if ignore
                    else _fail(f'Error from server (NotFound): secrets "{name}" not found')
                )
                continue
            path.unlink()
            print(f'secret "{name}" deleted')
            continue
        if not _delete_pod(state, name):
            rc = rc if ignore else _fail(f'Error from server (NotFound): pods "{name}" not found')
            continue
        print(f'pod "{name}" deleted')
    return rc


def _delete_pod(state: Path, name: str) -> bool:
    """TERM, KILL after the grace period, the record gone; False if there was none."""
    rec = _load(state, name)
    if rec is None:
        return False
    if rec.get("pid") and _alive(rec):
        grace = float(rec["pod"]["spec"].get("terminationGracePeriodSeconds", 30))
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec["pid"], signal.SIGTERM)
        if not _wait(lambda r=rec: not _session_pids(r["pid"]), grace):
            _kill(rec)
    elif rec.get("pid"):
        _kill(rec)  # a container whose init ended may leave children: the node reaps them
    with _locked(state), contextlib.suppress(FileNotFoundError):
        _path(state, name).unlink()
    return True


def _logs(state: Path, ns: str, args: list[str]) -> int:
    follow = "-f" in args or "--follow" in args
    tail = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--tail=")), None)
    words = [w for w in _positional(args) if w]
    name = words[0].removeprefix("pod/") if words else ""
    rec = _load(state, name)
    if rec is None:
        return _fail(f'Error from server (NotFound): pods "{name}" not found')
    if not rec.get("pid"):
        why = (rec.get("waiting") or {}).get("reason", "ContainerCreating")
        return _fail(
            f'Error from server (BadRequest): container "sglang" in pod "{name}" is waiting to start: {why}'
        )
    log = state / "pods" / f"{name}.log"
    data = log.read_bytes()
    lines = data.splitlines(keepends=True)
    if tail is not None:
        lines = lines[len(lines) - tail :] if tail > 0 else []
    sys.stdout.buffer.write(b"".join(lines))
    sys.stdout.buffer.flush()
    if not follow:
        return 0
    with open(log, "rb") as f:
        f.seek(len(data))
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                continue
            cur = _load(state, name)
            if cur is None or not _running(cur):
                sys.stdout.buffer.write(f.read())
                sys.stdout.buffer.flush()
                return 0
            time.sleep(0.05)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _port_forward(state: Path, ns: str, args: list[str]) -> int:
    words = _positional(args)
    name, ports = words[0].removeprefix("pod/"), words[1]
    local, _, remote = ports.partition(":")
    if _denied(state, "create", "pods/portforward"):
        return _forbidden("create", "pods/portforward", ns)
    rec = _load(state, name)
    if rec is None:
        return _fail(f'Error from server (NotFound): pods "{name}" not found')
    if not _running(rec):
        phase = _view(state, rec)["status"]["phase"]
        return _fail(
            f"error: unable to forward port because pod is not running. Current status={phase}"
        )
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        lst.bind(("127.0.0.1", int(local or 0)))
    except OSError as exc:
        return _fail(
            f"Unable to listen on port {local}: {exc}\nerror: unable to listen on any of the requested ports"
        )
    lst.listen(64)
    lst.settimeout(0.2)
    print(f"Forwarding from 127.0.0.1:{lst.getsockname()[1]} -> {remote}", flush=True)
    while True:
        cur = _load(state, name)
        if cur is None or not _running(cur):
            print("error: lost connection to pod", file=sys.stderr, flush=True)
            return 1
        try:
            conn, _ = lst.accept()
        except TimeoutError:
            continue
        print(f"Handling connection for {local}", flush=True)
        try:
            up = socket.create_connection(("127.0.0.1", int(remote)), timeout=5)
        except OSError:
            conn.close()
            continue
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _can_i(state: Path, ns: str, args: list[str]) -> int:
    words = _positional(args)
    verb, resource = words[0], words[1]
    if _denied(state, verb, resource):
        print("no")
        return 1
    print("yes")
    return 0


def _opt(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _positional(args: list[str]) -> list[str]:
    """The arguments that are not options nor an option's value (`-f` is a switch: follow)."""
    valued = {"-l", "--selector", "-o", "--output", "-c", "--container", "--address"}
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in valued:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def main(argv: list[str]) -> int:
    state = Path(argv[2])  # argv: SCRIPT --state DIR ARGS...
    raw = argv[3:]
    if raw[:1] == ["_init"]:
        return _init(state, raw[1], raw[3:])
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps({"argv": raw, "pid": os.getpid(), "t": time.time()}) + "\n")
    ns, args, i = "default", [], 0
    while i < len(raw):  # global flags anywhere
        a = raw[i]
        if a in ("--namespace", "-n", "--context") and i + 1 < len(raw):
            ns = raw[i + 1] if a != "--context" else ns
            i += 2
            continue
        args.append(a)
        i += 1
    cmd, rest = (args[0], args[1:]) if args else ("", [])
    if cmd == "auth" and rest[:1] == ["can-i"]:
        return _can_i(state, ns, rest[1:])
    if cmd == "version":
        print(json.dumps({"clientVersion": {"gitVersion": "v1.31.0-fake"}}))
        return 0
    handlers = {
        "create": _create,
        "get": _get,
        "delete": _delete,
        "logs": _logs,
        "port-forward": _port_forward,
    }
    if cmd not in handlers:
        return _fail(f'error: unknown command "{cmd}" for "kubectl"')
    return handlers[cmd](state, ns, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
