"""The study file's `target:` section: where the server runs, how it is reached and started, every
wait named, `target.container` (the commands it implies are built in `server/container.py`) and
`target.slurm` (built in `server/slurm.py`) and `target.kubernetes` (built in `server/kube.py`)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from tuner.config.base import Duration, Model, host_problem, image_reference
from tuner.config.kubernetes import KubernetesSection
from tuner.config.nodes import Node, as_node, rank0_host
from tuner.config.slurm import SlurmSection


class SSHSection(Model):
    """How to reach the GPU host (ignored for `host: local`)."""

    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None  # default ~/.ssh/known_hosts
    trust_unknown_host_key: bool = False  # explicit opt-in: accept and remember an unknown key
    ssh_config: str | None = None  # default ~/.ssh/config (aliases, ProxyJump)
    password_env: str | None = None  # name of an environment variable; never the password itself
    use_agent: bool = True  # offer keys from ssh-agent
    look_for_keys: bool = True  # also try ~/.ssh/id_* keys
    connect_timeout_s: Duration = 10
    banner_timeout_s: Duration = 15
    auth_timeout_s: Duration = 15
    channel_timeout_s: Duration = 10
    command_timeout_s: Duration = 60
    reconnect_attempts: int = Field(3, ge=1, le=20)


class Timeouts(Model):
    """Every wait the lifecycle does, named (seconds)."""

    ready_s: Duration = 900  # start -> /health 200 (weights of a large model load for minutes)
    stop_s: Duration = 60  # TERM -> group gone, then KILL
    port_free_s: Duration = 30
    gpu_free_s: Duration = 120
    poll_s: Duration = 1.0  # the longest wait between two polls
    http_s: Duration = 5  # one /health or /get_server_info request

    def poll_waits(self) -> Iterator[float]:
        """Waits between polls: 0.05 s doubling up to poll_s. A group gone, a port freed or a
        server ready just after the first look is seen then, not a whole poll_s later (1-3 s of
        each restart on the simulator); a long start-up is still polled every poll_s."""
        wait = min(0.05, self.poll_s)
        while True:
            yield wait
            wait = min(wait * 2, self.poll_s)


#: one entry of CUDA_VISIBLE_DEVICES: an index, or a GPU or MIG UUID as nvidia-smi -L lists it
GPU_ID_RE = re.compile(r"^(\d+|(GPU|MIG)-\S+)$", re.ASCII)


class TargetSection(Model):
    """Where the server runs and how it is started."""

    host: str = "local"  # `local`, an ssh_config alias, or a host name / address
    ssh: SSHSection = SSHSection()
    #: argv before the flags
    launch: list[str] = Field(default_factory=lambda: ["python", "-m", "sglang.launch_server"])
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES
    port: int = Field(30000, ge=1, le=65535)
    http_host: str | None = None  # address the tuner reaches the server at (default: the host)
    api_key_env: str | None = None  # environment variable holding --api-key; never stored
    #: real SGLang flags tuner's table lacks: passed as given, SGLang judges them (config.validate)
    unchecked_flags: list[str] = Field(default_factory=list)
    timeouts: Timeouts = Timeouts()
    container: ContainerSection | None = None  # run the server in one (schema: server/container.py)
    slurm: SlurmSection | None = None  # a step of a held allocation per server (config/slurm.py)
    kubernetes: KubernetesSection | None = None  # a pod per server (config/kubernetes.py)
    #: one server across nodes, rank i on nodes[i] (config/nodes.py); its rendezvous port
    nodes: list[Annotated[Node, BeforeValidator(as_node)]] | None = Field(None, min_length=2)
    dist_init_port: int | None = Field(None, ge=1, le=65535)

    _rank0_host = model_validator(mode="before")(rank0_host)  # target.nodes: host = nodes[0]

    @field_validator("launch")
    @classmethod
    def _launch(cls, v: list[str]) -> list[str]:
        if not v or not all(isinstance(a, str) and a for a in v):
            raise ValueError(
                "expected a non-empty list of arguments, e.g. [python, -m, sglang.launch_server]"
            )
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if v != "local" and (problem := host_problem(v, "target.ssh.port")):
            raise ValueError(problem)
        return v

    @field_validator("http_host")
    @classmethod
    def _http_host(cls, v: str | None) -> str | None:
        # "" is no address: left as it is, the night would go through the tunnel unasked
        if v is not None and (problem := host_problem(v, "target.port")):
            raise ValueError(f"{problem} (drop the key to go through the SSH tunnel)")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():  # else the logs would silently land in /tmp
            raise ValueError("expected a folder on the host (drop the key for the host's /tmp)")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: str | None) -> str | None:
        # CUDA stops reading CUDA_VISIBLE_DEVICES at its first bad entry ("" hides every GPU):
        # the server would start on fewer GPUs than asked, or on none
        ids = [] if v is None else v.split(",")
        if v is not None and not all(GPU_ID_RE.match(i.strip()) for i in ids):
            raise ValueError(
                f"expected GPU indexes or UUIDs separated by commas, e.g. '0,1' (got {v!r}); "
                "drop the key for every GPU"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return v


#: a name docker and podman accept for a container (and for a named volume)
NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


#: `SRC:DST[:OPTIONS]`: SRC an absolute host path or a volume name, DST absolute
_MOUNT_OPTIONS = frozenset({"ro", "rw", "z", "Z"})


#: run options the tuner owns: it names, labels, attaches to and removes its containers itself
_OWNED_OPTIONS = {
    "-d": "the client must stay attached: its output is the server log, its exit the server's",
    "--detach": "the client must stay attached: its output is the server log, its exit the server's",
    "--name": "the tuner names its containers (name_prefix) to stop them by name",
    "--rm": "the tuner removes its containers itself, after reading their exit code and log",
}


class ContainerSection(BaseModel):
    """`target.container`: run the server in a container (strict like the rest of the file)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    runtime: Literal["docker", "podman"] = "docker"
    image: str
    name_prefix: str = "tuner"
    # host networking: SGLang keeps listening on the host's own 127.0.0.1 (its default --host),
    # where the tuner -- or its SSH tunnel to the host -- reaches it. A published port (-p)
    # would need SGLang's --host 0.0.0.0 inside the container.
    run_options: list[str] = ["--gpus", "all", "--ipc", "host", "--network", "host"]
    mounts: list[str] = []  # SRC:DST[:ro], e.g. /data/models:/models:ro or hf-cache:/root/.cache
    #: variables passed in as `-e NAME` (values from the launch script's environment: target.env
    #: or the host's); None = every target.env name but PATH, and CUDA_VISIBLE_DEVICES
    env: list[str] | None = None
    stop_timeout_s: int = Field(30, ge=1, le=3600)  # `stop -t`: SIGTERM, then SIGKILL

    _image = field_validator("image")(image_reference)

    @field_validator("name_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not NAME_RE.match(v) or len(v) > 40:
            raise ValueError(
                f"{v!r} is not a container name: letters, digits, '_', '.', '-', "
                "starting with a letter or digit, at most 40 characters"
            )
        return v

    @field_validator("run_options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        for opt in v:
            if not opt:
                raise ValueError("an empty argument")
            why = _OWNED_OPTIONS.get(opt.split("=", 1)[0])
            if why:
                raise ValueError(f"{opt} is not allowed: {why}")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            if mount_problem(m):
                raise ValueError(f"{m!r}: {mount_problem(m)}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: list[str] | None) -> list[str] | None:
        for name in v or ():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return v


def mount_problem(mount: str) -> str | None:
    """Why `mount` is not `SRC:DST[:OPTIONS]`, or None."""
    parts = mount.split(":")
    shape = "expected SRC:DST or SRC:DST:ro (SRC an absolute path or a volume name, DST absolute)"
    if len(parts) not in (2, 3):
        return shape
    src, dst = parts[0], parts[1]
    if not (src.startswith("/") or NAME_RE.match(src)) or not dst.startswith("/"):
        return shape
    if len(parts) == 3 and not set(parts[2].split(",")) <= _MOUNT_OPTIONS:
        return f"options {parts[2]!r}: expected ro, rw, z or Z (comma-separated)"
    return None


def target_problem(launch: Sequence[str], workdir: str | None) -> tuple[str, str | None]:
    """(key, why not) when target.launch or target.workdir cannot work with a container."""
    if "{python}" in launch:
        why = "{python} is the tuner's own Python, not one inside the image; name it (python3)"
        return "target.launch", why
    if workdir and (":" in workdir or "," in workdir):
        return "target.workdir", (
            f"{workdir!r}: with a container, a path with ':' or ',' cannot be bind-mounted "
            "(the secret flags' file is written there)"
        )
    return "target.container", None
