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


def _each(each: int, total: int, groups: int) -> str:
    """`each` alone, or `each/total` over several DP groups (or replicas)."""
    return _n(each) if groups == 1 else f"{_n(each)}/{_n(total)}"


def _projection(report: dict[str, Any]) -> tuple[Table, list[str]]:
    t = Table(title="KV pool by --mem-fraction-static")
    lens = list(dict.fromkeys(a["avg_len"] for p in report["projection"] for a in p["admissible"]))
    for col in ("mfs", "tokens", "delta", "KV GB", "free GiB", "max run"):
        t.add_column(col, justify="right")
    for length in lens:
        t.add_column(f"@{length:g}", justify="right")
    groups = report["parallel"]["groups"]
    notes = [f"basis: {report['projection_basis']}."]
    notes.append(
        "tokens: per GPU rank; free GiB: left for CUDA graphs and activations; "
        "@L: requests of L tokens at once."
    )
    if groups > 1:
        notes.append(
            f"a/b: per DP {'group' if report['dp_attention'] else 'replica'} / over all "
            f"{groups}: each holds its own pool and its own requests."
        )
    for p in report["projection"]:
        flag = "!" if "warning" in p else ""
        fits = {
            a["avg_len"]: _each(a["requests"], a["requests_total"], groups) for a in p["admissible"]
        }
        t.add_row(
            f"{p['mfs']:g}{flag}",
            _n(p["max_total_num_tokens"]),
            f"{p['delta_tokens']:+,}" if "delta_tokens" in p else "",
            f"{p['kv_gb']:.2f}",
            f"{p['headroom_gib']:.1f}",
            _each(p["max_running_requests"], p["max_running_requests_total"], groups),
            *(fits.get(length, "0") for length in lens),
        )
        if flag:
            notes.append(f"! mfs {p['mfs']:g}: {p['warning']}.")
    return t, notes


def _speculative(report: dict[str, Any]) -> tuple[Table, list[str]]:
    """The draft by SGLang 0.5.23's rules, 0.5.6.post2's beside them."""
    s = report["speculative"]
    old, graphs = s["sglang_0_5_6"], s["cuda_graphs"]
    layers = f"{s['draft_layers']} draft layer" + ("s" if s["draft_layers"] != 1 else "")
    t = Table(title=f"Speculative decoding ({s['algorithm']}, {layers})")
    t.add_column("")
    t.add_column("SGLang 0.5.23", justify="right")
    t.add_column("0.5.6.post2", justify="right")
    weights = s["draft_weights_gib"] or 0
    t.add_row(
        "KV bytes/token/GPU",
        f"{_n(s['target_bytes_per_token'])} + {_n(s['draft_bytes_per_token'])}",
        f"{_n(old['bytes_per_token'])}; draft pool {_n(old['draft_pool_bytes_per_token'])}",
    )
    t.add_row(
        "draft weights", f"{weights:g} GiB in the KV budget", f"{weights:g} GiB from headroom"
    )
    t.add_row(
        "steps / top-k / draft tokens",
        f"{s['num_steps']} / {s['eagle_topk']} / {s['num_draft_tokens']}",
        " / ".join(str(v) for v in old["params"]),
    )
    t.add_row(
        "extra KV slots",
        f"{s['extra_slots_per_request']} per running request",
        f"+{_n(old['extra_pool_tokens'])} on the pool",
    )
    reserve = graphs["sglang_reserve_mib"]
    t.add_row(
        "default mfs reserve",
        f"{reserve['0.5.23']:,} MiB",
        f"{reserve['0.5.6.post2']:,} MiB",
    )
    flag = s["max_running_requests_flag"]
    notes = [
        f"draft layers: {s['draft_layers_from']}; steps: {s['params_from']}.",
        f"0.5.23 divides the KV budget by target + draft ({_n(report['bytes_per_token'])} B) after "
        "both models' weights; 0.5.6.post2 sizes the target's pool alone, then the draft's "
        f"weights, its own pool ({old['draft_pool_bytes_from']}) and the extra slots come out "
        "of the (1 - mfs) headroom.",
        f"--max-running-requests {flag}"
        + (
            " (SGLang resets it to 48 for speculation when unset)"
            if s["max_running_requests_reset"]
            else ""
        )
        + (
            f", split among {report['parallel']['attn_dp']} DP groups"
            if report["parallel"]["attn_dp"] > 1
            else ""
        )
        + ".",
        f"CUDA graphs: captured for batch sizes 1..{graphs['max_bs']} ({len(graphs['capture_bs'])} "
        f"sizes), each verifying {graphs['tokens_per_bs']} draft tokens per request: up to "
        f"{_n(graphs['max_tokens'])} tokens a graph; the draft's graphs run {graphs['draft_tokens_per_bs']} "
        "token(s) per request a step. SGLang has no formula for their memory: its default mfs "
        "only keeps the reserve above back.",
    ]
    rows = [p for p in report["projection"] if "sglang_0_5_6" in p]
    if rows:
        cells = ", ".join(
            f"mfs {p['mfs']:g}: {_n(p['sglang_0_5_6']['max_total_num_tokens'])} tokens, "
            f"{p['sglang_0_5_6']['headroom_gib']:.1f} GiB free"
            for p in rows
        )
        notes.append(f"0.5.6.post2's pool and the headroom its draft leaves: {cells}.")
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
        ranks = report["parallel"]["ranks"]
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
    con.print(f"  {report['kv_layout']['detail']}", highlight=False)
    par = report["parallel"]
    con.print(
        f"{par['describe']}: {report['gpus']} GPUs, {par['ranks']} ranks (each its own KV and "
        f"HiCache pool), attention TP {par['attn_tp']}",
        highlight=False,
    )
    if "dp_attention_weights" in report:
        w = report["dp_attention_weights"]
        how = "added to the plain server's" if w["added"] else "not added (--plain-basis adds it)"
        con.print(
            f"  DP attention holds ~{w['extra_gib_per_gpu']:g} GiB more weights per GPU "
            f"({w['detail']}); {how}",
            highlight=False,
        )
    if "sglang_defaults" in report:
        d = report["sglang_defaults"]
        con.print(
            f"SGLang's defaults here: --mem-fraction-static {d['mem_fraction_static']}, "
            f"--chunked-prefill-size {d['chunked_prefill_size']}, "
            f"--cuda-graph-max-bs {d['cuda_graph_max_bs']}",
            highlight=False,
        )
        if "reserve_mib" in d:
            r = d["reserve_mib"]
            con.print(
                f"  0.5.6.post2's reserve: {r['total']:,.0f} MiB = {r['base']:,.0f} + DP attention "
                f"{r['dp_attention']:,.0f} + draft {r['speculative']:,.0f}",
                highlight=False,
            )
    sections = []
    if "naive" in report:
        sections.append(_comparison(report, inp))
    if report["projection"]:
        sections.append(_projection(report))
    if "speculative" in report:
        sections.append(_speculative(report))
    if report["hicache"]:
        sections.append(_hicache(report))
    for table, notes in sections:
        con.print()
        con.print(table)
        for note in notes:
            con.print(f"  {note}", style="dim", highlight=False)
    if not sections:
        con.print(report["hicache_note"], style="dim")
