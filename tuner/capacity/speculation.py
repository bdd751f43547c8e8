"""Speculative decoding's memory, as SGLang sizes it. Pure.

A draft model (EAGLE, EAGLE-3, an MTP head, a STANDALONE small model) costs the server four
things besides the target's: its weights, its own KV per token, extra KV slots per running
request while a decode step drafts and verifies, and CUDA graphs captured for batch x draft
tokens. SGLang accounts for them differently in the two versions tuner knows (paths under
`python/sglang/`):

- 0.5.23 counts the draft's weights and KV in the KV budget: the weights load before the pool
  is profiled (`srt/managers/scheduler.py:1077-1111`, `init_target_memory_pool` after the draft
  worker exists; `srt/mem_cache/kv_cache_configurator.py:3038-3057`, "draft weights are now
  counted"), and the cell grows by `int(cell x draft layers / target layers)`
  (`srt/model_executor/pool_configurator.py:259-314`; `calculus.with_draft`). Each running
  request reserves `2 x spec_decode_alloc_len` slots a decode step (`srt/utils/common.py:
  4424-4448`, `srt/mem_cache/allocation_sizing.py:28-70`).
- 0.5.6.post2 sizes the target's pool from the target alone, then enlarges it by
  `max_num_reqs x (steps x topk + draft tokens) + 100` slots (`draft_runner_cache_size`) and
  gives the draft a pool of that many tokens at the draft's own cell
  (`srt/model_executor/model_runner.py:1693-1714`): the draft's weights, its pool and the extra
  slots all come out of the `(1 - mfs)` headroom meant for CUDA graphs and activations, which
  is why its default mfs reserves 2 GiB more for an EAGLE draft and 6 GiB for STANDALONE
  (`srt/server_args.py:874-880`). 0.5.23's default reserves nothing for it.

Both reset `--max-running-requests` to 48 when it is unset (0.5.6.post2 `srt/server_args.py:
1739-1743`; 0.5.23 `srt/arg_groups/speculative_hook.py:1086-1094`) and choose steps, top-k and
draft tokens by the model's architecture when none is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.capacity.calculus import text_config
from tuner.errors import ModelConfigError
from tuner.sglang import specargs

#: `--speculative-algorithm` values that load a draft model (NGRAM drafts from a cache)
DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
#: `--max-running-requests` when speculation leaves it unset (both versions)
SPEC_MAX_RUNNING_REQUESTS = 48
#: 0.5.6.post2's buffer on top of the draft's slots (`model_runner.py:1708-1709`)
V056_POOL_BUFFER = 100
#: MiB SGLang 0.5.6.post2's default mfs adds for a draft and its graphs (`server_args.py:874-880`)
V056_DEFAULT_RESERVE_MIB = {"STANDALONE": 6 * 1024, "NGRAM": 0}
V056_EAGLE_RESERVE_MIB = 2 * 1024


def architecture(config: Mapping[str, Any]) -> str:
    """The architecture SGLang picks speculative defaults by: the config's top-level
    `architectures[0]` (`get_hf_config().architectures[0]`; a vision-language model's own,
    not its text model's), else `text_config`'s."""
    for cfg in (config, text_config(config)):
        archs = cfg.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return archs[0]
    return ""


def auto_params(algorithm: str, arch: str, version: str) -> tuple[int, int, int]:
    """(steps, top-k, draft tokens) SGLang picks when none is given: `sglang.specargs`'s
    rules (0.5.6.post2 `server_args.py:4649-4680`, 0.5.23
    `arg_groups/speculative_hook.py:1430-1461`), the ones the simulator plays."""
    return specargs.auto_params(algorithm, arch or None, version != "0.5.6.post2")


def resolve_params(
    algorithm: str,
    arch: str,
    version: str,
    steps: int | None = None,
    topk: int | None = None,
    draft_tokens: int | None = None,
) -> tuple[int, int, int, str]:
    """(steps, top-k, draft tokens, how) as SGLang resolves them: all three from the
    architecture when steps is unset (SGLang asserts top-k and draft tokens are unset too),
    and draft tokens = steps + 1 whenever top-k is 1 (0.5.6.post2 `server_args.py:1789-1817`,
    0.5.23 `speculative_hook.py:1159-1267`). Raises ValueError for a combination SGLang
    refuses."""
    if steps is None:
        if topk is not None or draft_tokens is not None:
            raise ValueError(
                "--speculative-eagle-topk and --speculative-num-draft-tokens need "
                "--speculative-num-steps (SGLang asserts they are unset without it)"
            )
        s, k, n = auto_params(algorithm, arch, version)
        return s, k, n, f"SGLang {version}'s choice for {arch or 'this architecture'}"
    if topk is None:
        raise ValueError("--speculative-num-steps needs --speculative-eagle-topk")
    if topk == 1:
        return steps, 1, steps + 1, "given (top-k 1: draft tokens = steps + 1, as SGLang sets)"
    if draft_tokens is None:
        raise ValueError("--speculative-eagle-topk above 1 needs --speculative-num-draft-tokens")
    return steps, topk, draft_tokens, "given"


def draft_layers_of(draft_config: Mapping[str, Any]) -> int:
    """The KV layers of a draft model from its config.json: `num_nextn_predict_layers` when
    present, else its layer count (0.5.23 `model_runner_components/spec_aux_hidden_state.py:
    150-175`; 0.5.6.post2 `model_executor/model_runner.py:1370-1375` for the draft's pool)."""
    cfg = text_config(draft_config)
    for name in ("num_nextn_predict_layers", "num_hidden_layers"):
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ModelConfigError("draft config: no num_nextn_predict_layers or num_hidden_layers")


def mtp_layers(config: Mapping[str, Any]) -> int | None:
    """The target's own MTP head (DeepSeek-V3 family): `num_nextn_predict_layers`, the draft
    SGLang uses when no draft path is given; None when the config has none."""
    value = text_config(config).get("num_nextn_predict_layers")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _ceil_align(x: int, page: int) -> int:
    return -(-x // page) * page


def decode_alloc_len(page_size: int, steps: int, topk: int, draft_tokens: int) -> int:
    """KV slots one request allocates in a decode step: the draft's top-k x steps against the
    verify's draft tokens, page-aligned (0.5.23 `srt/utils/common.py:4424-4448`,
    `spec_decode_alloc_len_per_request`)."""
    per_topk, tokens = steps or 1, draft_tokens or 1
    k = topk or 1
    if page_size > 1 and k > 1:
        per_topk = _ceil_align(per_topk + page_size, page_size)
        tokens = _ceil_align(tokens, page_size)
    elif page_size > 1:
        per_topk = _ceil_align(per_topk, page_size)
        tokens = _ceil_align(tokens, page_size)
    return max(per_topk * k, tokens)


def extra_slots_per_request(page_size: int, steps: int, topk: int, draft_tokens: int) -> int:
    """KV slots 0.5.23 reserves per running request each decode step beyond its own tokens:
    twice `decode_alloc_len` (`srt/mem_cache/allocation_sizing.py:64-70`: a double buffer for
    the overlap scheduler's lag)."""
    return 2 * decode_alloc_len(page_size, steps, topk, draft_tokens)


def v056_extra_tokens(max_num_reqs: int, steps: int, topk: int, draft_tokens: int) -> int:
    """Slots 0.5.6.post2 adds to the target's profiled pool, beyond its memory budget
    (`model_runner.py:1700-1709`, `draft_runner_cache_size`): every request's draft and
    verify tokens at once, plus 100. `max_num_reqs`: `--max-running-requests` as given (48
    under speculation when unset), not split among DP groups."""
    return max_num_reqs * (steps * topk + draft_tokens) + V056_POOL_BUFFER


def running_requests_flag(flag: int | None, speculative: bool) -> tuple[int | None, bool]:
    """(`--max-running-requests` as SGLang runs it, whether SGLang reset it to 48)."""
    if flag is None and speculative:
        return SPEC_MAX_RUNNING_REQUESTS, True
    return flag, False


def default_reserve_mib(algorithm: str | None, version: str) -> int:
    """MiB SGLang's default mfs keeps back for a draft: 0.5.6.post2 2,048 (EAGLE, EAGLE3,
    NEXTN), 6,144 (STANDALONE), 0 (NGRAM); 0.5.23 none (`arg_groups/memory_hook.py:281-325`:
    the draft's weights are in the KV budget instead)."""
    if algorithm is None or version != "0.5.6.post2":
        return 0
    return V056_DEFAULT_RESERVE_MIB.get(algorithm, V056_EAGLE_RESERVE_MIB)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """Decode batch sizes SGLang captures CUDA graphs for under speculation (0.5.6.post2
    `server_args.py:914-922`, 0.5.23 `arg_groups/cuda_graph_hook.py:516-531`), up to `max_bs`
    (SGLang also caps it at the request pool, `cuda_graph_runner.py:193-208`); each target
    graph verifies `draft tokens` per request, so it runs bs x draft tokens tokens."""
    sizes = [
        *range(1, 9),
        *range(10, 33, 2),
        *range(40, 65, 4),
        *range(72, 257, 8),
        *range(272, max_bs + 1, 16),
    ]
    out = [bs for bs in sizes if bs <= max_bs]
    if max_bs >= 1 and max_bs not in out:
        out.append(max_bs)
    return out


@dataclass(frozen=True)
class Speculation:
    """A launch's speculative decoding as its flags say (full SGLang names)."""

    algorithm: str
    draft_path: str | None
    steps: int | None
    topk: int | None
    draft_tokens: int | None

    @property
    def has_draft(self) -> bool:
        return self.algorithm in DRAFT_ALGORITHMS

    def own_mtp(self, model_path: Any) -> bool:
        """Is the draft the target's own MTP head (no draft path, or the model's own)?"""
        return self.draft_path in (None, "") or self.draft_path == model_path


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def speculation_of(flags: Mapping[str, Any]) -> Speculation | None:
    """The speculative decoding a launch asks for (flags under SGLang's full names), or None."""
    algorithm = flags.get("speculative-algorithm")
    if not algorithm or not isinstance(algorithm, str):
        return None
    path = flags.get("speculative-draft-model-path")
    return Speculation(
        algorithm=algorithm.upper(),
        draft_path=str(path) if path else None,
        steps=_int(flags.get("speculative-num-steps")),
        topk=_int(flags.get("speculative-eagle-topk")),
        draft_tokens=_int(flags.get("speculative-num-draft-tokens")),
    )


def v056_slots_bound(flags: Mapping[str, Any], spec: Speculation) -> int:
    """The most slots 0.5.6.post2 can add beyond a trial's profiled pool: its own steps,
    top-k and draft tokens when given, else the largest SGLang auto-chooses (5, 4, 8)."""
    steps, topk, tokens = spec.steps or 5, spec.topk or 4, spec.draft_tokens or 8
    if spec.topk == 1 and spec.steps:
        tokens = spec.steps + 1
    flag, _ = running_requests_flag(_int(flags.get("max-running-requests")), True)
    return v056_extra_tokens(flag or SPEC_MAX_RUNNING_REQUESTS, steps, topk, tokens)
