"""How high mem-fraction-static can go on a memory layout, read from the GPU memory its servers
held under load. Pure.

SGLang sizes the KV pool from the memory free once the weights are in, less (1 - mfs) of the
GPU's memory at start (0.5.6.post2 `model_runner.profile_max_num_token`: rest_memory =
available - total_gpu_memory x (1 - mfs)). Raising mfs by d moves d x that memory into the pool
and out of the headroom; nothing else moves with it: the weights, the CUDA graphs, the request
table, a draft, and the activations of the largest prefill batch the load runs. A server that
ran its load at mfs m0 and then held `used` of its GPU's `total` MiB (nvidia-smi after a run:
PyTorch's caching allocator keeps what a forward pass needed reserved until SGLang's
/flush_cache empties it, trial/runner.py reads it before the next run's flush) leaves the same
load, at mfs m,

    free(m) = total - used - (m - m0) x total

(`total`, the GPU's whole memory, is a little more than SGLang's memory at start: the slope is
never understated, so free(m) is never overstated). Where free(m) < 0, that load's largest
prefill would not fit: the server fails its CUDA-graph capture or dies under load.

One thing does move with mfs under 0.5.6.post2's speculative decoding: the draft's own pool
is sized in tokens like the target's (sim/memplan.py), so it grows by the draft's cell over the
target's (1/61 on Kimi: about 100 MiB for six hundredths of mfs) out of the headroom. The prediction is
that much optimistic there; a jump that dies for it is halved below as any failure is.

Each reading is a lower bound on what the layout's load needs (a later run may prefill a larger
batch), so the ceiling is the lowest any reading predicts, and never at or below an mfs where a
server of the layout ran its load and lived: a measurement beats a prediction.

What it is for (search/edge.py): the probe toward the cliff jumps to the highest mfs predicted
to fit instead of halfway to the range's top, and counts the cliff as found one grid step above
the best once the prediction says so (Kimi TP8: 0.85 -> 0.91, where halving went 0.90, 0.93
(died under load), 0.91). The pre-check never rejects on it: a prediction is not a failure,
and the sampler may still propose more. A jump that dies is an ordinary failure the bisection
then works below. Servers without nvidia-smi (the HTTP simulator, a CPU host) leave no reading,
and the probe halves as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from optuna.trial import FrozenTrial, TrialState

from tuner.capacity.precheck import memory_key
from tuner.outcome import Attr, Status
from tuner.search.neighbour import mfs_of
from tuner.server.records import GPU_TOTAL, GPU_USED

Flags = Mapping[str, Any]
#: nvidia-smi counts whole MiB: a prediction this close to zero free is taken to fit
ROUNDING_MIB = 1.0


class Reading(NamedTuple):
    """A server's GPU memory after its load runs, at its mfs (MiB)."""

    mfs: float
    used_mib: float
    total_mib: float

    def free_at(self, mfs: float) -> float:
        """MiB the same load would leave free at `mfs` (the module docstring's free(m))."""
        return self.total_mib - self.used_mib - (mfs - self.mfs) * self.total_mib


def reading_of(t: FrozenTrial) -> Reading | None:
    """The trial's reading (trial/runner.py records it in the server info), or None."""
    info = t.user_attrs.get(Attr.SERVER_INFO) or {}
    used, total, m = info.get(GPU_USED), info.get(GPU_TOTAL), mfs_of(t)
    if m is None or not isinstance(used, int | float) or not isinstance(total, int | float):
        return None
    return Reading(m, float(used), float(total)) if 0 < used <= total else None


def ceiling(
    trials: Sequence[FrozenTrial],
    params: Flags,
    grid: Sequence[float],
    flags_for: Callable[[Flags], Flags],
) -> float | None:
    """The lowest grid mfs that the readings of `params`' memory layout predict will not fit
    its load, above every mfs where a server of that layout lived through its load; None
    without a reading, or when every grid point above fits."""
    key = memory_key(flags_for(params))
    readings: list[Reading] = []
    lived = -1.0
    for t in trials:
        if t.state != TrialState.COMPLETE or memory_key(flags_for(t.params)) != key:
            continue
        r = reading_of(t)
        if r is None:
            continue
        readings.append(r)  # after a run it survived: a later one may still have killed it
        if t.user_attrs.get(Attr.STATUS) != Status.DIED:
            lived = max(lived, r.mfs)
    if not readings:
        return None
    for m in sorted(grid):
        if m > lived + 1e-9 and min(r.free_at(m) for r in readings) < -ROUNDING_MIB:
            return m
    return None
