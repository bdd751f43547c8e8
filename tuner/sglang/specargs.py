"""SGLang's post-init rules for speculative decoding, per version (`postinit.resolve` runs them).
Pure.

0.5.6.post2: `server_args.py:1722-1867` (`_handle_speculative_decoding`) and `:4649-4680`
(`auto_choose_speculative_params`). 0.5.23: `arg_groups/speculative_hook.py:121-284`
(`handle_speculative_decoding`), `:1072-1283` (`_handle_eagle_family`), `:1285-1371`
(`_handle_ngram`), `:1430-1461` (`_auto_choose_speculative_params`), and
`speculative/spec_info.py:50-65` (`from_string`). Paths under `sglang/srt/`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class State(Protocol):
    """What the rules read and change (`postinit.State`)."""

    version: str
    arch: str | None

    @property
    def new(self) -> bool: ...

    def get(self, key: str) -> Any: ...

    def set(self, **values: Any) -> None: ...

    def warn(self, line: str) -> None: ...

    def refuse(self, exception: str, message: str = "") -> Exception: ...

    def attn_dp(self) -> int: ...


#: the fields these rules read, with SGLang's defaults
DEFAULTS: Mapping[str, Any] = {
    "speculative_algorithm": None,
    "speculative_draft_model_path": None,
    "speculative_draft_model_revision": None,
    "speculative_num_steps": None,
    "speculative_eagle_topk": None,
    "speculative_num_draft_tokens": None,
    "speculative_ngram_max_bfs_breadth": 10,
    "speculative_ngram_max_match_window_size": 12,
}

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
#: 0.5.23's built-in algorithms (`speculative/spec_info.py:39-47`); NEXTN is an alias of EAGLE
BUILTIN_NEW = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")

MAX_RUNNING_48 = (
    "Max running requests is reset to 48 for speculative decoding. You can override this by "
    "explicitly setting --max-running-requests."
)
NDT_ADJUSTED = (
    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
    "speculative_eagle_topk == 1"
)
STANDALONE_DP = "Currently standalone speculative decoding does not support dp attention."
NGRAM_DP = "Currently ngram speculative decoding does not support dp attention."
TRTLLM_TOPK = "trtllm_mha backend only supports topk = 1 for speculative decoding."
PAGED_TREE_OLD = (
    "speculative_eagle_topk > 1 with page_size > 1 is unstable and produces incorrect results "
    "for paged attention backends. This combination is only supported for the 'flashinfer' "
    "backend."
)
#: 0.5.23 `arg_groups/speculative_hook.py:1271`
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
REFUSALS = (
    STANDALONE_DP,
    NGRAM_DP,
    TRTLLM_TOPK,
    "with page_size > 1 is",
    "Unknown speculative algorithm name",
)

#: whose MTP layer is the draft: the draft path defaults to the model's own
#: (0.5.6.post2 server_args.py:1767-1787; 0.5.23 arg_groups/speculative_hook.py:1124-1157)
MTP_ARCHS_OLD = (
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
)
MTP_ARCHS_NEW = (
    *MTP_ARCHS_OLD,
    "DeepseekV4ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "HYV3ForCausalLM",
    "HYV4ForCausalLM",
    "Qwen4ExpForConditionalGeneration",
)
_NO_MTP_WARNING = ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")
#: (steps, topk, draft tokens) by architecture (auto_choose_speculative_params)
_AUTO_334 = (
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV2ForCausalLM",
    "GptOssForCausalLM",
    "Glm4MoeForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
)
_AUTO_334_NEW = (
    *_AUTO_334,
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "MiMoV2ForCausalLM",
    "MiMoV2FlashForCausalLM",
)


def auto_params(algorithm: str, arch: str | None, new: bool) -> tuple[int, int, int]:
    """SGLang's (num_steps, eagle_topk, num_draft_tokens) when `--speculative-num-steps` is
    unset: STANDALONE (3, 1, 4); Llama and Grok (5, 4, 8); the DeepSeek family (3, 1, 4);
    anything else (5, 4, 8) in 0.5.6.post2, (3, 1, 4) in 0.5.23."""
    if algorithm == "STANDALONE":
        return (3, 1, 4)
    if arch in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        return (5, 4, 8)
    if arch in (_AUTO_334_NEW if new else _AUTO_334):
        return (3, 1, 4)
    return (3, 1, 4) if new else (5, 4, 8)


def apply(st: State) -> None:
    """The version's speculative-decoding rules on `st` (raises PostInitError to refuse)."""
    if st.get("speculative_draft_model_path") is not None and (
        st.get("speculative_draft_model_revision") is None
    ):
        st.set(speculative_draft_model_revision="main")
    algorithm = st.get("speculative_algorithm")
    if algorithm is None:
        return
    if st.new:
        algorithm = algorithm.upper()  # speculative_hook.py:137-144
        if algorithm in ("NEXTN", "EAGLE"):  # :81-118 (a Gemma-4 draft is not played)
            algorithm = "EAGLE"
        st.set(speculative_algorithm=algorithm)
        if algorithm not in BUILTIN_NEW:  # spec_info.py:50-65 (no plugins registered)
            raise st.refuse("ValueError", f"Unknown speculative algorithm name: {algorithm}")
    elif algorithm == "NEXTN":  # server_args.py:1729-1730
        algorithm = "EAGLE"
        st.set(speculative_algorithm=algorithm)
    if algorithm in EAGLE_FAMILY:
        _eagle_family(st, algorithm)
    elif algorithm == "NGRAM":
        _ngram(st)


def _reset_max_running(st: State) -> None:
    if st.get("max_running_requests") is None:
        st.set(max_running_requests=48)
        st.warn(MAX_RUNNING_48)


def _eagle_family(st: State, algorithm: str) -> None:
    """EAGLE, EAGLE3, STANDALONE: 0.5.6.post2 server_args.py:1732-1826; 0.5.23
    arg_groups/speculative_hook.py:1072-1283."""
    if algorithm == "STANDALONE" and st.attn_dp() > 1:
        raise st.refuse("ValueError", STANDALONE_DP)
    _reset_max_running(st)
    if st.new:
        if st.get("disable_overlap_schedule"):  # :1097-1102
            st.warn(
                "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone "
                "speculative decoding."
            )
        if st.get("enable_mixed_chunk") and algorithm == "STANDALONE":  # :1104-1118
            st.set(enable_mixed_chunk=False)
            st.warn(
                f"Mixed chunked prefill is disabled: {algorithm} speculative decoding does "
                "not support it."
            )
    else:
        # SGLANG_ENABLE_SPEC_V2 unset (its default): :1754-1758
        st.set(disable_overlap_schedule=True)
        st.warn(
            "Overlap scheduler is disabled because of using eagle3 or standalone speculative "
            "decoding."
        )
        if st.get("enable_mixed_chunk"):  # :1760-1765
            st.set(enable_mixed_chunk=False)
            st.warn(
                "Mixed chunked prefill is disabled because of using eagle speculative decoding."
            )
    if st.arch in (MTP_ARCHS_NEW if st.new else MTP_ARCHS_OLD):
        if st.get("speculative_draft_model_path") is None:
            st.set(
                speculative_draft_model_path=st.get("model_path"),
                speculative_draft_model_revision=st.get("revision"),
            )
        elif st.arch not in _NO_MTP_WARNING:
            st.warn("DeepSeek MTP does not require setting speculative_draft_model_path.")
    if st.get("speculative_num_steps") is None:
        if st.get("speculative_eagle_topk") is not None or (
            st.get("speculative_num_draft_tokens") is not None
        ):
            raise st.refuse("AssertionError")
        steps, topk, tokens = auto_params(algorithm, st.arch, st.new)
        st.set(
            speculative_num_steps=steps,
            speculative_eagle_topk=topk,
            speculative_num_draft_tokens=tokens,
        )
    topk, steps = st.get("speculative_eagle_topk"), st.get("speculative_num_steps")
    backends = {
        st.get(k)
        for k in ("attention_backend", "decode_attention_backend", "prefill_attention_backend")
    }
    if "trtllm_mha" in backends and topk > 1:
        raise st.refuse("ValueError", TRTLLM_TOPK)
    if topk == 1 and st.get("speculative_num_draft_tokens") != steps + 1:
        st.warn(NDT_ADJUSTED)
        st.set(speculative_num_draft_tokens=steps + 1)
    _paged_tree(st, topk)


def _paged_tree(st: State, topk: int) -> None:
    """A draft tree (topk > 1) on pages: only some attention backends. An unresolved backend
    (None: SGLang picks one later by the GPU) is not refused here."""
    backend = st.get("attention_backend")
    if topk <= 1 or st.get("page_size") <= 1 or backend is None:
        return
    if st.new and backend not in PAGE_TREE_BACKENDS:
        raise st.refuse(
            "ValueError",
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
            f"{PAGE_TREE_BACKENDS}; got attention_backend={backend!r}. Use page_size == 1 or "
            "one of those backends.",
        )
    if not st.new and backend not in ("flashinfer", "fa3"):
        raise st.refuse("ValueError", PAGED_TREE_OLD)


def _ngram(st: State) -> None:
    """0.5.6.post2 server_args.py:1828-1867; 0.5.23 arg_groups/speculative_hook.py:1285-1371
    (the device is taken to be CUDA)."""
    _reset_max_running(st)
    if st.new:
        st.set(
            enable_mixed_chunk=False,
            speculative_eagle_topk=st.get("speculative_ngram_max_bfs_breadth"),
        )
        if st.get("speculative_num_draft_tokens") is None:
            st.set(speculative_num_draft_tokens=12)
            st.warn(
                "speculative_num_draft_tokens is set to 12 by default for ngram speculative "
                "decoding. You can override this by explicitly setting "
                "--speculative-num-draft-tokens."
            )
        if st.get("speculative_num_steps") is None:
            topk = st.get("speculative_eagle_topk")
            st.set(speculative_num_steps=st.get("speculative_num_draft_tokens") // topk)
        st.warn(
            "The mixed chunked prefill are disabled because of using ngram speculative decoding."
        )
    else:
        st.set(
            disable_overlap_schedule=True,
            enable_mixed_chunk=False,
            speculative_eagle_topk=st.get("speculative_ngram_max_bfs_breadth"),
        )
        if st.get("speculative_num_draft_tokens") is None:
            st.set(speculative_num_draft_tokens=st.get("speculative_ngram_max_match_window_size"))
        st.warn(
            "The overlap scheduler and mixed chunked prefill are disabled because of using ngram "
            "speculative decoding."
        )
    topk, page, backend = (
        st.get(k) for k in ("speculative_eagle_topk", "page_size", "attention_backend")
    )
    if topk > 1 and page > 1 and backend is not None and backend != "flashinfer":
        raise st.refuse(
            "ValueError",
            f"speculative_eagle_topk({topk}) > 1 with page_size({page}) > 1 is unstable and "
            "produces incorrect results for paged attention backends. This combination is only "
            "supported for the 'flashinfer' backend.",
        )
    if st.attn_dp() > 1:
        raise st.refuse("ValueError", NGRAM_DP)
