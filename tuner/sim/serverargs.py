"""ServerArgs' resolution on the simulator's namespace: SGLang's defaults from the GPU, then its
post-init adjustments and refusals (`tuner.sglang.postinit`), written back as SGLang does. Pure.

`resolve_server_args(ns, profile)` returns the `Defaults` the start-up uses and the `Levers`
(DP attention groups, the speculative shape, SGLang's warnings, its refusal or the simulator's
own). The namespace is updated in place with what SGLang resolved (`chunked_prefill_size //
dp`, `schedule_conservativeness x 0.3`, `max_running_requests` 48, the draft tokens, ...), so
`/server_info` reports the resolved args as SGLang's does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from tuner.sglang import postinit
from tuner.sglang.defaults import default_chunked_prefill_and_graph_bs, default_mem_fraction_static
from tuner.sglang.flags import DEFAULT_VERSION
from tuner.sim.levers import DRAFT_ALGORITHMS
from tuner.sim.memplan import SpecShape
from tuner.sim.profile import Profile


@dataclass(frozen=True)
class Defaults:
    """What ServerArgs.__post_init__ resolves from the GPU size when a flag is not given (the
    chunked prefill size after DP attention divided it)."""

    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    context_len: int
    served_model_name: str


@dataclass(frozen=True)
class Levers:
    """DP attention and speculative decoding as SGLang resolved them for this launch."""

    dp_groups: int = 1
    spec: SpecShape | None = None
    #: SGLang's post-init warnings, in order (printed before the `server_args=` line)
    warnings: tuple[str, ...] = ()
    #: SGLang's refusal (exception line, exit 1), or None
    refusal: postinit.Refusal | None = None
    #: the simulator's own refusal (a draft the profile lacks): argparse's form, exit 2
    unsimulated: str | None = None
    #: the profile's acceptance kind the traffic plays (`--sim-acceptance`)
    acceptance_kind: str | None = None


def played_version(ns: argparse.Namespace) -> str:
    """The SGLang version the simulator plays (`--sim-sglang-version`)."""
    return getattr(ns, "sim_sglang_version", None) or DEFAULT_VERSION


def _fields(ns: argparse.Namespace) -> dict[str, Any]:
    keys = (*postinit.DEFAULTS, "attn_dp_size")
    return {k: getattr(ns, k) for k in keys if hasattr(ns, k)}


def resolve_server_args(ns: argparse.Namespace, profile: Profile) -> tuple[Defaults, Levers]:
    """SGLang's defaults for this GPU (sglang-reference.md section 1), then its post-init."""
    version = played_version(ns)
    d_chunk, d_bs = default_chunked_prefill_and_graph_bs(profile.gpu_mem_mib, ns.tp_size)
    chunk = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else d_chunk
    if ns.cuda_graph_max_bs is not None:
        bs = ns.cuda_graph_max_bs
    elif ns.cuda_graph_bs:
        bs = max(ns.cuda_graph_bs)
    else:
        bs = d_bs
    flags = {**_fields(ns), "chunked_prefill_size": chunk, "cuda_graph_max_bs": bs}
    mfs = ns.mem_fraction_static
    levered = postinit.dp_attention_groups(flags, version) > 1 or bool(
        flags.get("speculative_algorithm")
    )
    if mfs is None and levered:
        mfs = postinit.default_mem_fraction_static(profile.gpu_mem_mib, flags, version)
    elif mfs is None:
        mfs = default_mem_fraction_static(profile.gpu_mem_mib, ns.tp_size, ns.pp_size, chunk, bs)
    ctx = ns.context_length or profile.context_len()
    served = ns.served_model_name or ns.model_path
    asked = levered or flags.get("enable_dp_attention") or flags.get("enable_dp_lm_head")
    if not asked:  # nothing post-init changes here that the simulator models
        return Defaults(mfs, chunk, bs, ctx, served), Levers()
    res = postinit.resolve({**flags, "model_path": ns.model_path}, version, profile.architecture)
    _write_back(ns, res, version)
    d = Defaults(mfs, res.flags["chunked_prefill_size"], bs, ctx, served)
    if res.error is not None:
        return d, Levers(res.attn_dp_size, None, res.warnings, res.error)
    spec, unsimulated, kind = _spec(ns, profile, res)
    return d, Levers(res.attn_dp_size, spec, res.warnings, None, unsimulated, kind)


def _write_back(ns: argparse.Namespace, res: postinit.Resolved, version: str) -> None:
    """SGLang's ServerArgs after post-init: changed fields on the namespace (`/server_info`)."""
    for key, value in res.flags.items():
        if key in ("chunked_prefill_size", "cuda_graph_max_bs", "model_path"):
            continue  # reported from Defaults / as given
        if hasattr(ns, key) and getattr(ns, key) != value:
            setattr(ns, key, value)
    if postinit.is_new(version):  # resolved_dict reports the width (server_args.py:331-332)
        ns.enable_dp_attention = res.attn_dp_size > 1


def _spec(
    ns: argparse.Namespace, profile: Profile, res: postinit.Resolved
) -> tuple[SpecShape | None, str | None, str | None]:
    """The speculative shape the engine plays, or why the simulator cannot play it."""
    f = res.flags
    algorithm = f.get("speculative_algorithm")
    if algorithm is None:
        return None, None, None
    draft = profile.speculative
    where = f"profile {profile.name}"
    if algorithm not in DRAFT_ALGORITHMS or draft is None or algorithm not in draft.algorithms:
        serves = ", ".join(draft.algorithms) if draft is not None else "none"
        return (
            None,
            _flag_error(
                f"{algorithm} is not simulated on {where} (its speculative drafts: {serves})"
            ),
            None,
        )
    if f.get("speculative_draft_model_path") is None:
        return (
            None,
            _flag_error(
                f"{algorithm} on {profile.architecture} needs --speculative-draft-model-path "
                "(SGLang makes the model its own draft only for MTP architectures)"
            ),
            None,
        )
    kind = getattr(ns, "sim_acceptance", None) or draft.default_kind
    if kind not in draft.acceptance:
        return (
            None,
            _flag_error(
                f"--sim-acceptance {kind}: {where} has {', '.join(draft.acceptance)}",
                "--sim-acceptance",
            ),
            None,
        )
    shape = SpecShape(
        algorithm,
        int(f["speculative_num_steps"]),
        int(f["speculative_eagle_topk"]),
        int(f["speculative_num_draft_tokens"]),
    )
    return shape, None, kind


def _flag_error(text: str, flag: str = "--speculative-algorithm") -> str:
    """The simulator's refusal in argparse's form (exit 2), as for a value it cannot take."""
    return f"launch_server.py: error: argument {flag}: {text}"
