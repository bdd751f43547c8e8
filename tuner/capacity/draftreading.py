"""`tuner capacity`'s reading of a speculative draft: what it adds per token, per request, to the
fixed part and to the CUDA graphs, by SGLang 0.5.23's rules, with 0.5.6.post2's beside them
(`capacity.speculation` holds the facts and their sources). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.capacity import calculus as cap
from tuner.capacity import speculation as spec
from tuner.errors import ModelConfigError


@dataclass(frozen=True)
class DraftInputs:
    """The draft `tuner capacity` was told of: its layers (given, from its config, or the
    model's own MTP head), weights per GPU, and SGLang's speculative flags (None: SGLang's)."""

    algorithm: str = "EAGLE3"
    layers: int | None = None
    config: Mapping[str, Any] | None = None
    weights_gib: float | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None


@dataclass(frozen=True)
class Draft:
    """A draft resolved against the target: layers, cells, SGLang's step parameters."""

    inputs: DraftInputs
    layers: int
    layers_from: str
    target_layers: int
    target_cell: int  # the target's bytes per token per GPU
    cell: int  # with the draft's share, as 0.5.23 divides the budget
    own_cell: int  # the draft's own pool cell, as 0.5.6.post2 sizes it
    own_cell_from: str
    steps: int
    topk: int
    draft_tokens: int
    params_from: str
    #: (steps, top-k, draft tokens) as 0.5.6.post2 resolves them (its auto choice may differ)
    v056_params: tuple[int, int, int]

    @property
    def weights_bytes(self) -> float:
        return (self.inputs.weights_gib or 0.0) * cap.GIB


def resolve_draft(
    inp: DraftInputs,
    model_config: Mapping[str, Any],
    layout: cap.KVLayout,
    attn_tp: int,
    kv_dtype: str,
) -> Draft:
    """The draft's layers and cells. Raises ModelConfigError when nothing gives its layers,
    ValueError for step parameters SGLang refuses."""
    if inp.layers is not None:
        layers, source = inp.layers, "--draft-layers"
    elif inp.config is not None:
        layers, source = (
            spec.draft_layers_of(inp.config),
            "the draft's config.json (--draft-model-config)",
        )
    elif (mtp := spec.mtp_layers(model_config)) is not None:
        layers, source = mtp, "the model's own MTP head (num_nextn_predict_layers)"
    else:
        raise ModelConfigError(
            "the draft's layers: give --draft-layers or --draft-model-config (the model config "
            "has no num_nextn_predict_layers for its own MTP head)"
        )
    per_layer = layout.bytes_per_token / layout.num_layers
    own, own_from = int(per_layer * layers), "estimated as the target's KV per layer"
    if inp.config is not None:
        try:
            draft_layout = cap.kv_layout(inp.config, attn_tp, kv_dtype)
        except ModelConfigError as exc:
            raise ModelConfigError(f"draft config: {exc}") from None
        own = int(draft_layout.bytes_per_token / draft_layout.num_layers * layers)
        own_from = f"the draft's config ({draft_layout.kind.upper()}, attention TP {attn_tp})"
    arch = spec.architecture(model_config)
    given = (inp.num_steps, inp.eagle_topk, inp.num_draft_tokens)
    steps, topk, tokens, how = spec.resolve_params(inp.algorithm, arch, "0.5.23", *given)
    old = spec.resolve_params(inp.algorithm, arch, "0.5.6.post2", *given)[:3]
    return Draft(
        inputs=inp,
        layers=layers,
        layers_from=source,
        target_layers=layout.num_layers,
        target_cell=layout.bytes_per_token,
        cell=cap.with_draft(layout.bytes_per_token, layout.num_layers, layers),
        own_cell=own,
        own_cell_from=own_from,
        steps=steps,
        topk=topk,
        draft_tokens=tokens,
        params_from=how,
        v056_params=old,
    )


def v056_pool(
    draft: Draft, mfs: float, free0: float, fixed: float, page_size: int, flag: int
) -> dict[str, Any]:
    """0.5.6.post2's pool at `mfs` and what is left for CUDA graphs: the target's pool is
    profiled before the draft loads (`fixed` less the draft's weights, the target's cell), then
    enlarged by `draft_runner_cache_size`'s slots; the draft's weights, its own pool of that
    many tokens and the slots all come out of the `(1 - mfs)` headroom."""
    profiled = cap.pool_tokens(mfs, free0, fixed - draft.weights_bytes, draft.target_cell)
    extra = spec.v056_extra_tokens(flag, *draft.v056_params)
    tokens = max(0, (profiled + extra) // page_size * page_size)
    used = draft.weights_bytes + extra * draft.target_cell + tokens * draft.own_cell
    return {
        "max_total_num_tokens": tokens,
        "headroom_gib": round(((1 - mfs) * free0 - used) / cap.GIB, 2),
    }


def draft_reading(
    draft: Draft, page_size: int, flag: int, reset: bool, graph_max_bs: int, running_cap: int
) -> dict[str, Any]:
    """The JSON block `speculative` (keys in docs/capacity.md)."""
    inp = draft.inputs
    max_bs = max(1, min(graph_max_bs, running_cap))
    capture = spec.capture_batch_sizes(max_bs)
    return {
        "algorithm": inp.algorithm,
        "draft_layers": draft.layers,
        "draft_layers_from": draft.layers_from,
        "target_layers": draft.target_layers,
        "target_bytes_per_token": draft.target_cell,
        "draft_bytes_per_token": draft.cell - draft.target_cell,
        "draft_weights_gib": inp.weights_gib,
        "num_steps": draft.steps,
        "eagle_topk": draft.topk,
        "num_draft_tokens": draft.draft_tokens,
        "params_from": draft.params_from,
        "max_running_requests_flag": flag,
        "max_running_requests_reset": reset,
        "extra_slots_per_request": spec.extra_slots_per_request(
            page_size, draft.steps, draft.topk, draft.draft_tokens
        ),
        "cuda_graphs": {
            "capture_bs": capture,
            "max_bs": max(capture),
            "tokens_per_bs": draft.draft_tokens,
            "max_tokens": max(capture) * draft.draft_tokens,
            "draft_tokens_per_bs": draft.topk,
            "sglang_reserve_mib": {
                "0.5.6.post2": spec.default_reserve_mib(inp.algorithm, "0.5.6.post2"),
                "0.5.23": spec.default_reserve_mib(inp.algorithm, "0.5.23"),
            },
        },
        "sglang_0_5_6": {
            "bytes_per_token": draft.target_cell,
            "draft_pool_bytes_per_token": draft.own_cell,
            "draft_pool_bytes_from": draft.own_cell_from,
            "params": list(draft.v056_params),
            "extra_pool_tokens": spec.v056_extra_tokens(flag, *draft.v056_params),
        },
    }
