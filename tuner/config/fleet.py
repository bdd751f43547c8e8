"""`fleet:` in the study file: several GPU hosts, one worker each, sharing one study.

    target:                      # what every worker shares
      launch: [python, -m, sglang.launch_server]
      ssh: {user: me}
    fleet:
      - worker: gpu-a            # a name `--worker` accepts, unique in the fleet
        host: gpu-a              # any target: key, deep-merged onto target:
      - worker: gpu-b
        host: gpu-b
        ssh: {port: 2222}        # only ssh.port changes: ssh.user stays `me`

Each entry is `target:` with the entry's keys merged in (mappings key by key, anything else
replaced), then validated as the study's target would be: a mistake names the entry's key
(`fleet[1].ssh.port`). Two workers cannot share a server's port on one host, nor its GPUs (a
worker without `gpus:` on a host another worker uses takes them all). The study's fingerprint
keeps the file's own `target:` (`Fleet.base_target`): a worker's host, port, GPUs or
environment are where the study runs, not what it measures (the server identity check still
stops a worker whose GPU model or SGLang differs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tuner.config.base import Model
from tuner.config.target import TargetSection
from tuner.errors import ConfigError

KEY = "fleet"


class FleetMember(Model):
    """One worker of the fleet: its name and its whole target (target: with its keys merged)."""

    worker: str
    target: TargetSection


class Fleet(Model):
    """The fleet of a study file; `worker` names the member a config runs as (None: all)."""

    members: tuple[FleetMember, ...]
    base_target: TargetSection
    worker: str | None = None

    def names(self) -> list[str]:
        return [m.worker for m in self.members]

    def member(self, worker: str) -> FleetMember | None:
        return next((m for m in self.members if m.worker == worker), None)


def worker_problem(name: Any) -> str | None:
    """Why `name` is no worker name (as `tuner tune --worker` takes one), or None."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200 or not name.isprintable():
        return f"expected a printable name of 1 to 200 characters, got {name!r}"
    return None


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` onto `base`: a mapping in both merges key by key; anything else (a list, a
    value, null) in `over` replaces `base`'s. Neither argument is changed."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_fleet(
    raw: Any, data: Mapping[str, Any], source: str, validate: Callable[[dict[str, Any]], Any]
) -> Fleet:
    """The validated fleet of the study file `data` (its `fleet:` value is `raw`).

    `validate(study_mapping)` is the schema's own parse (config.schema.parse_schema): each
    member is judged as a whole study file whose `target:` is the member's, and a mistake in
    it is reported under the member's key (`fleet[1].port`), never `target.port`."""

    def bad(message: str, key: str = KEY) -> ConfigError:
        return ConfigError(message, file=source, key=key)

    if not isinstance(raw, list) or not raw:
        raise bad(
            "expected a list of workers, each `- worker: NAME` with the target: keys it changes"
        )
    base = data.get("target") or {}
    if not isinstance(base, Mapping):
        raise bad("target: must be a mapping for a fleet's workers to change it", "target")
    members: list[FleetMember] = []
    for i, entry in enumerate(raw):
        at = f"{KEY}[{i}]"
        if not isinstance(entry, Mapping):
            raise bad(f"expected a mapping (worker: NAME, and target: keys), got {entry!r}", at)
        if "worker" not in entry:
            raise bad(
                "required key is missing (the worker's name, as --worker takes it)", f"{at}.worker"
            )
        name = entry["worker"]
        if (problem := worker_problem(name)) is not None:
            raise bad(problem, f"{at}.worker")
        over = {k: v for k, v in entry.items() if k != "worker"}
        for key in over:
            if key not in TargetSection.model_fields:
                raise bad(
                    f"unknown key (a fleet entry takes worker: and target: keys: "
                    f"{', '.join(TargetSection.model_fields)})",
                    f"{at}.{key}",
                )
        study = {k: v for k, v in data.items() if k != KEY}
        study["target"] = deep_merge(base, over)
        try:
            cfg = validate(study)
        except ConfigError as exc:
            raise _moved(exc, at) from None
        members.append(FleetMember(worker=name, target=cfg.target))
    _check_distinct(members, source)
    return Fleet(members=tuple(members), base_target=TargetSection.model_validate(base))


def check_members(cfg: Any, check: Callable[[Any], None]) -> None:
    """Run `check` (config.validate.check_study) on each member's config, a mistake reported
    under the member's key."""
    fleet: Fleet | None = cfg.fleet
    for i, member in enumerate(fleet.members if fleet is not None else ()):
        try:
            check(member_config(cfg, member.worker))
        except ConfigError as exc:
            raise _moved(exc, f"{KEY}[{i}]") from None


def member_config(cfg: Any, worker: str) -> Any:
    """The study config `worker` of the fleet runs: its target; the fleet kept (fingerprint)."""
    fleet: Fleet = cfg.fleet
    member = fleet.member(worker)
    if member is None:
        raise ConfigError(
            f"the fleet has no worker {worker!r} (its workers: {', '.join(fleet.names())})",
            key="--worker",
        )
    return cfg.model_copy(
        update={"target": member.target, "fleet": fleet.model_copy(update={"worker": worker})}
    )


def _moved(exc: ConfigError, at: str) -> ConfigError:
    """A member's error under `at`: `target.ssh.port` -> `fleet[1].ssh.port`; a key outside
    target: (a cross-check of the member's target with server: flags) gets the member named."""
    key = exc.key or ""
    if key == "target" or key.startswith("target."):
        return ConfigError(exc.detail, file=exc.file, key=at + key.removeprefix("target"))
    return ConfigError(f"{exc.detail} (worker {at})", file=exc.file, key=exc.key)


def _host_of(t: TargetSection) -> tuple[str, int | None]:
    """A machine as the fleet tells them apart: `local`, or a host name and its SSH port."""
    host = t.host.strip().lower()
    return (host, None) if host == "local" else (host, t.ssh.port)


def _check_distinct(members: list[FleetMember], source: str) -> None:
    """Unique names; on one host, no port twice and no GPU twice."""
    seen: dict[str, int] = {}
    for i, m in enumerate(members):
        if m.worker in seen:
            raise ConfigError(
                f"worker {m.worker!r} is also fleet[{seen[m.worker]}]: each worker needs its own name",
                file=source,
                key=f"{KEY}[{i}].worker",
            )
        seen[m.worker] = i
    for i, m in enumerate(members):
        for j in range(i):
            other = members[j]
            if _host_of(m.target) != _host_of(other.target):
                continue
            where = f"host {m.target.host}"
            if m.target.port == other.target.port:
                why = (
                    f"port {m.target.port} of {where} is also fleet[{j}] ({other.worker})'s: "
                    "give each worker its own port"
                )
            elif clash := _gpus_clash(m.target.gpus, other.target.gpus):
                why = (
                    f"uses {clash} of {where}, as fleet[{j}] ({other.worker}) does: give each "
                    'worker its own GPUs (gpus: "0,1")'
                )
            else:
                continue
            raise ConfigError(why, file=source, key=f"{KEY}[{i}]")


def _gpus_clash(a: str | None, b: str | None) -> str | None:
    """Why two servers' CUDA_VISIBLE_DEVICES on one host overlap, or None (unset: every GPU)."""
    if a is None or b is None:
        return "every GPU (no gpus:)"
    shared = sorted({g.strip() for g in a.split(",")} & {g.strip() for g in b.split(",")})
    return f"GPU {','.join(shared)}" if shared else None
