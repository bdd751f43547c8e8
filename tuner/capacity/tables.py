"""Renders `tuner capacity`'s reading as tables: naive beside corrected, then the details.

Cells stay short so the tables read in an 80-column terminal; explanations go below each table.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.capacity.analysis import CapacityInputs


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _comparison(report: dict[str, Any], inp: CapacityInputs) -> tuple[Table, list[str]]:
    naive, obs = report["naive"], report["observed"]
    tokens = obs["max_total_num_tokens"]
    t = Table(title="Naive reading vs SGLang's formulas")
    t.add_column("question")
    t.add_column("naive", style="red", justify="right")
    t.add_column("corrected", style="green", justify="right")
    t.add_row("KV bytes/token/GPU", _n(naive["bytes_per_token"]), _n(report["bytes_per_token"]))
    t.add_row(f"KV of {_n(tokens)} tokens", f"{inp.observed_kv_gb:g} GB", f"{obs['kv_gb']:.2f} GB")
    for extra, verdict in zip(naive["extra_by_hicache_size"], report["hicache"], strict=False):
        t.add_row(
            f"--hicache-size {extra['hicache_size_gb']:g}",
            f"+{_n(extra['extra_tokens'])} tokens",
            f"{_n(verdict['host_total_gb'])} GB host, "
            + ("fits" if verdict["feasible"] else "INFEASIBLE"),
        )
    t.add_row("running tokens, HiCache on", _n(naive["total_tokens"]), f"{_n(tokens)} (same)")
    corrected_adm = {a["avg_len"]: a["requests"] for a in obs["admissible"]}
    for row in naive["concurrent_requests"]:
        t.add_row(
            f"requests of {_n(row['avg_len'])} tok",
            str(row["requests"]),
            str(corrected_adm.get(row["avg_len"], "?")),
        )
    projected = {p["mfs"]: p for p in report["projection"]}
    for lin in naive["mfs_linear_tokens"]:
        p = projected.get(lin["mfs"])
        corrected = "needs --gpu-mem-mib"
        if p:
            pct = 100 * p["delta_tokens"] / tokens
            corrected = f"{_n(p['max_total_num_tokens'])} ({pct:+.0f}%)" + (
                "*" if "warning" in p else ""
            )
        t.add_row(
            f"pool at mfs {lin['mfs']:g}",
            f"{_n(lin['tokens'])} ({lin['gain_pct']:+.1f}%)",
            corrected,
        )
    notes = [
        "naive assumes: " + "; ".join(naive["assumptions"]) + ".",
        f"corrected: bytes/token from config.json ({report['kv_layout']['detail']}); "
        "--hicache-size is GB per rank; the pool grows by delta-mfs x free GPU memory / bytes per "
        "token, it is not proportional to mfs; running capacity is the GPU pool alone.",
        "requests at once = pool / length: mid-flight requests are shorter than their final length, "
        "so more run until they grow (and then some are retracted).",
    ]
    if any("warning" in p for p in report["projection"]):
        notes.append("* only if CUDA graphs and activations still fit in what is left: measure.")
    return t, notes


def _projection(report: dict[str, Any]) -> tuple[Table, list[str]]:
    t = Table(title="KV pool by --mem-fraction-static")
    lens = [a["avg_len"] for a in report["projection"][0]["admissible"]]
    for col in ("mfs", "tokens", "delta", "KV GB", "free GiB", "max run"):
        t.add_column(col, justify="right")
    for length in lens:
        t.add_column(f"@{length:g}", justify="right")
    notes = [f"basis: {report['projection_basis']}."]
    notes.append(
        "free GiB: left for CUDA graphs and activations; @L: requests of L tokens at once."
    )
    for p in report["projection"]:
        flag = "!" if "warning" in p else ""
        t.add_row(
            f"{p['mfs']:g}{flag}",
            _n(p["max_total_num_tokens"]),
            f"{p['delta_tokens']:+,}" if "delta_tokens" in p else "",
            f"{p['kv_gb']:.2f}",
            f"{p['headroom_gib']:.1f}",
            _n(p["max_running_requests"]),
            *(str(a["requests"]) for a in p["admissible"]),
        )
        if flag:
            notes.append(f"! mfs {p['mfs']:g}: {p['warning']}.")
    return t, notes


def _hicache(report: dict[str, Any]) -> tuple[Table, list[str]]:
    t = Table(title="HiCache (--hicache-size is GB per rank)")
    for col in ("GB/rank", "host total GB", "host tokens/rank", "feasible"):
        t.add_column(col, justify="right")
    notes = []
    for h in report["hicache"]:
        size = f"{h['hicache_size_gb_per_rank']:g}"
        t.add_row(
            size,
            _n(h["host_total_gb"]),
            _n(h["host_tokens_per_rank"]),
            "yes" if h["feasible"] else "NO",
        )
        notes.append(f"{size} GB: {h['reason']}.")
    if "hicache_max_gb_per_rank" in report:
        ranks = report["tp"] * report["dp"]
        notes.append(
            f"largest --hicache-size all {ranks} ranks hold together: "
            f"{report['hicache_max_gb_per_rank']} GB per rank."
        )
    notes.append(report["hicache_note"])
    return t, notes


def render_capacity(
    report: dict[str, Any], inp: CapacityInputs, console: Console | None = None
) -> None:
    """Print the reading: summary lines, the naive comparison, projection and HiCache tables."""
    con = console or Console()
    con.print(f"[bold]KV bytes per token per GPU rank:[/] {_n(report['bytes_per_token'])}")
    con.print(f"  {report['kv_layout']['detail']}")
    if "sglang_defaults" in report:
        d = report["sglang_defaults"]
        con.print(
            f"SGLang's defaults here: --mem-fraction-static {d['mem_fraction_static']}, "
            f"--chunked-prefill-size {d['chunked_prefill_size']}, "
            f"--cuda-graph-max-bs {d['cuda_graph_max_bs']}"
        )
    sections = []
    if "naive" in report:
        sections.append(_comparison(report, inp))
    if report["projection"]:
        sections.append(_projection(report))
    if report["hicache"]:
        sections.append(_hicache(report))
    for table, notes in sections:
        con.print()
        con.print(table)
        for note in notes:
            con.print(f"  {note}", style="dim", highlight=False)
    if not sections:
        con.print(report["hicache_note"], style="dim")
