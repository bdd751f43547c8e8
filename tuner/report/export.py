"""Best trial -> SGLang `--config` YAML (with a provenance header), a command line, or JSON;
every trial -> CSV (`tuner.report.rows`).

Values are written as the user would: a sampled 0.8700000000000001 on a 0.01 grid is 0.87 in
every format (`search.space.tidy`, from the trial's own distributions).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shlex
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tuner.check.flagset import version_problems
from tuner.config.schema import StudyConfig
from tuner.errors import InfraError, TunerError
from tuner.loadgen.plan import longer_run
from tuner.outcome import SLO_METRICS, Attr, full_params
from tuner.search.space import client_params, server_flags, tidy_params
from tuner.server.launch import (
    config_cli_flags,
    effective_flags,
    flag_args,
    is_secret_name,
    render_sglang_yaml,
)
from tuner.sglang.flags import spelled_for
from tuner.verdict.tails import TAIL_NAMES, thin_notes, thin_tails
from tuner.verdict.trials import all_confirm_tails, completed, feasible_trials, server_info_of
from tuner.verdict.winner import best_trial, held_note, versus_runner_up

LAUNCH = ["python", "-m", "sglang.launch_server"]
SERVER_FACTS = (
    "version",
    "max_total_num_tokens",
    "max_running_requests",
    "mem_fraction_static",
    "gpu",
)


class NothingToExport(TunerError):
    """No trial of the study is feasible yet."""


def best_flags(cfg: StudyConfig, params: dict[str, Any]) -> dict[str, Any]:
    """The launch config: the study's fixed flags plus the winner's server-side values, as the
    trials launched them (`effective_flags`: SGLang's full names, HiCache as hicache-size says),
    secrets left out."""
    flags = effective_flags({**cfg.server, **server_flags(params)})
    return {k: v for k, v in flags.items() if not is_secret_name(k)}


def export_data(cfg: StudyConfig, study: optuna.Study) -> dict[str, Any]:
    """Everything worth keeping about the winner (the JSON format; the others derive from it)."""
    trial, summary = best_trial(study)
    if trial is None:
        n = len(completed(study))
        raise NothingToExport(
            f"study '{cfg.study}' has no feasible configuration yet ({n} completed trials): "
            "see `tuner status` for the reasons"
        )
    metrics = trial.user_attrs.get(Attr.METRICS) or {}
    info = server_info_of(study, trial)
    # inner search: the concurrency it chose on the winner's server is the recommended client
    params = tidy_params(full_params(trial.params, trial.user_attrs), trial.distributions)
    data = {
        "study": cfg.study,
        "trial": trial.number,
        "params": params,
        "flags": best_flags(cfg, params),
        "client": client_params(params),
        "objective": cfg.objective.metric,
        "value": trial.values[0],
        "confirmation": summary,
        "metrics": metrics,
        "server": {k: info[k] for k in SERVER_FACTS if k in info},
        "feasible_trials": len(feasible_trials(study)),
        "completed_trials": len(completed(study)),
        "exported_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if (versus := versus_runner_up(study)) is not None:
        data["versus_runner_up"] = versus
    # flags the winner's SGLang version would refuse (a version without a table: none judged)
    # judged as the export writes them (`spelled_for`: a renamed flag in the version's spelling)
    version = _version(data)
    warnings = list(version_problems(spelled_for(data["flags"], version), version))
    warnings += _thin(cfg, trial, study)
    if warnings:
        data["warnings"] = warnings
    if cfg.objective.pareto_latency:
        data["pareto_front"] = [
            {
                "trial": t.number,
                "values": t.values,
                "params": tidy_params(t.params, t.distributions),
            }
            for t in study.best_trials
        ]
    return data


def _thin(cfg: StudyConfig, trial: optuna.trial.FrozenTrial, study: optuna.Study) -> list[str]:
    """A warning per limit the winner's runs judged on too few values to have a tail
    (verdict.tails.thin_tails): the export would otherwise pass a p99 that is not one."""
    runs = [trial.user_attrs.get(Attr.TAILS), *all_confirm_tails(study).get(str(trial.number), [])]
    return thin_notes(thin_tails(runs), longer_run(cfg.workload), "the median of the winner's runs")


def render_yaml(data: dict[str, Any]) -> str:
    """SGLang's --config YAML with a comment header of where it came from and what it measured."""
    m, conf = data["metrics"], data["confirmation"]
    version = _version(data)
    flags = spelled_for(data["flags"], version)
    # switches SGLang's --config refuses (--x/--no-x, deprecated ones) are the command line's
    cli = flag_args(config_cli_flags(flags, version), version)
    header = [
        f"SGLang launch config exported by tuner from study '{data['study']}', trial {data['trial']}",
        "  use: python -m sglang.launch_server --config best.yaml" + "".join(f" {a}" for a in cli),
        *(
            ["  (those flags go on the command line: SGLang's --config cannot take --x/--no-x)"]
            if cli
            else []
        ),
        f"measured: {data['value']:,.1f} {data['objective']} ({_what(data['objective'], m)}), "
        f"{m.get('request_throughput', 0):.2f} req/s completed",
        f"  bench_serving's output_throughput (completed requests only): "
        f"{m.get('output_throughput', 0):,.1f} tok/s",
        f"latency p99: TTFT {m.get('p99_ttft_ms', 0):,.0f} ms, TPOT {m.get('p99_tpot_ms', 0):,.1f} ms, "
        f"ITL {m.get('p99_itl_ms', 0):,.1f} ms",
    ]
    if conf.get("runs") and len(conf["runs"]) > 1:
        header.append(
            f"confirmed over {len(conf['runs'])} runs: mean {conf['mean']:,.1f} "
            f"({data['objective']}), spread {conf['spread_pct']:.1f}%{held_note(conf)}"
        )
    elif conf.get("hold_odds") is not None:  # one run, near a limit
        header.append(held_note(conf).removeprefix(", "))
    if conf.get("pooled"):
        header.append(_pooled(conf["pooled"]))
    # not empty only when every candidate missed: the winner is the least bad, and says so
    header += [
        f"WARNING: no candidate holds its SLOs pooled: {m}" for m in conf.get("pooled_missed", ())
    ]
    if "versus_runner_up" in data:
        header.append(_versus(data["versus_runner_up"]))
    if data["client"]:
        header.append(
            "recommended client: " + ", ".join(f"{k} {v}" for k, v in data["client"].items())
        )
    server = data["server"]
    header.append(
        f"server: SGLang {server.get('version', '?')}, max_total_num_tokens "
        f"{server.get('max_total_num_tokens', '?')}, "
        + (f"GPU {server['gpu']}" if "gpu" in server else "GPU not reported (no nvidia-smi)")
    )
    header.append(f"exported {data['exported_at']}; --api-key, if any, goes on the command line")
    if respelled := _respelled(data["flags"], flags):
        header.append(f"written as SGLang {version} spells it: {respelled}")
    header += [f"WARNING: {w}" for w in data.get("warnings", ())]
    header.append("")
    return render_sglang_yaml(flags, header, version)


def _respelled(measured: dict[str, Any], written: dict[str, Any]) -> str:
    """What `spelled_for` changed, in words ('' when nothing)."""
    gone = [f"--{k}" for k in measured if k not in written]
    new = [f"--{k}" for k in written if k not in measured]
    return f"{' '.join(gone)} as {' '.join(new) or 'its default'}" if gone else ""


def _versus(v: dict[str, Any]) -> str:
    """The winner against the runner-up, in words: a real difference or within the noise."""
    worth = ""
    if (odds := v.get("runner_up_odds")) is not None:
        # the gap is against its worth: a mean near the winner's can be far behind on odds
        worth = (
            f", worth {v['runner_up_worth']:,.1f} at odds {odds:.2f} a fresh start holds its limits"
        )
    head = (
        f"vs the runner-up (trial {v['runner_up']}, mean {v['runner_up_mean']:,.1f}{worth}): "
        f"{v['gap_pct']:+.1f}%"
    )
    if v.get("runner_up_missed"):
        return f"vs the runner-up (trial {v['runner_up']}): it missed {v['runner_up_missed'][0]}"
    if v["separated"] is None:
        return head + "; noise unknown (one run each: raise budget.confirm_repeats)"
    noise = f"run-to-run noise {v['noise_pct']:.1f}%, 2 sigma of the gap {v['two_sigma_pct']:.1f}%"
    if v["separated"]:
        return f"{head}, beyond the noise ({noise})"
    if v.get("steadier"):
        return f"{head}, within the noise ({noise}): the steady one wins"
    return f"{head}, within the noise ({noise}): as good as each other"


def _pooled(p: dict[str, Any]) -> str:
    """The winner's p99s over every request of its runs together (results._pooled), e.g.
    `pooled over 3 runs (1,512 requests): p99 TTFT 812 ms, p99 TPOT 41.3 ms (limits 1000, 50)`."""
    limits = p.get("limits") or {}
    shown = [k for k, _ in SLO_METRICS.values() if k in p and k in limits]
    figures = [f"p99 {TAIL_NAMES[k]} {p[k]:,.{1 if k in _FINE else 0}f} ms" for k in shown]
    if p.get("error_rate"):
        figures.append(f"error rate {p['error_rate']:.2%}")
    line = f"pooled over {p['runs']} runs ({p['ended']:,} requests): " + ", ".join(figures)
    if not shown:
        return line
    return line + f" (limit{'s' * (len(shown) > 1)} {', '.join(f'{limits[k]:g}' for k in shown)})"


_FINE = ("p99_tpot_ms", "p99_itl_ms")  # tens of ms: one decimal, as the header's own p99s


def _what(metric: str, m: dict[str, Any]) -> str:
    """What the score counted, in words."""
    if metric == "window_output_throughput":
        return f"tok/s: output tokens received in the {m.get('duration', 0):.0f} s window"
    if metric in ("request_throughput", "goodput"):
        return "req/s" + (": completed within the SLOs" if metric == "goodput" else "")
    return "tok/s"


def _version(data: dict[str, Any]) -> str | None:
    """The winner's SGLang version, without a note after it (`0.5.23 (virtual time)`)."""
    version = data["server"].get("version")
    return str(version).split()[0] if version else None


def render_cmd(data: dict[str, Any]) -> str:
    version = _version(data)
    flags = spelled_for(data["flags"], version)
    return " ".join(shlex.quote(a) for a in [*LAUNCH, *flag_args(flags, version)])


def render(data: dict[str, Any], fmt: str) -> str:
    """The winner in `fmt` (yaml, cmd, json); CSV is every trial's (`report.rows.trials_csv`)."""
    if fmt == "yaml":
        return render_yaml(data)
    if fmt == "cmd":
        return render_cmd(data) + "\n"
    return json.dumps(data, indent=2, default=str) + "\n"


def write_best(cfg: StudyConfig, study: optuna.Study, out_dir: Path) -> tuple[Path, str]:
    """Write the winner's launch config to `out_dir/best.yaml`; (path, text)."""
    text = render_yaml(export_data(cfg, study))
    path = out_dir / "best.yaml"
    write_text(path, text)
    return path, text


def write_text(path: Path, text: str, *, newline: str | None = None) -> None:
    """`text` to `path`, atomically (`write_atomic`)."""

    def write(to: Path) -> None:
        with to.open("w", newline=newline) as f:
            f.write(text)

    write_atomic(path, write)


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` a temporary file beside `path`, then rename it over `path`: a kill or a
    full disk mid-write leaves the previous file whole, never a truncated one. A device or a
    FIFO (/dev/stdout) is written in place; a symlink keeps pointing at the file it names.
    A write that fails (no space, a folder gone) is an InfraError naming `path`, one line."""
    try:
        if path.exists() and not path.is_file():
            write(path)
            return
        real = Path(os.path.realpath(path))
        real.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(real.stat().st_mode) if real.exists() else None
        tmp = real.with_name(f".{real.name}.{secrets.token_hex(4)}.tmp")
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask's mode
        try:
            write(tmp)
            with tmp.open("rb+") as f:
                os.fsync(f.fileno())
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, real)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise InfraError(f"cannot write {path}: {exc.strerror or exc}") from None
