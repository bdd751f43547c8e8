"""The simulated SGLang scheduler on a virtual clock. Pure: no asyncio, no wall clock, no I/O.

What it models, after SGLang's scheduler.py / schedule_policy.py (v0.5.6):
- one scheduler iteration per `step()`: a prefill batch when the waiting queue (or a chunked
  request) can be admitted, else one decode step of the running batch; prefill pauses decode;
- admission by free GPU KV slots (free + evictable cache) minus what running requests may still
  need (`new_token_ratio x remaining max_new_tokens`, clipped at 4096), `--max-running-requests`,
  `--max-prefill-tokens`, chunked prefill (`--chunked-prefill-size`), SGLang's `batch_is_full`;
- `new_token_ratio`: starts at 0.7 x conservativeness, decays to 14% of that over 600 decode
  steps, resets when idle, jumps after a retraction (KV full during decode);
- `--disable-radix-cache` with requests that run to max_new_tokens: SGLang's exact "will they
  all finish" admission (add_one_req_ignore_eos), which never retracts;
- a radix prefix cache and HiCache host tier (radix.py); load-back is costed by PCIe. Matches
  are whole 16-token blocks (or pages); a finished request's generated tokens stay cached under
  keys no prompt can match, so a multi-turn follow-up reuses its earlier prompt, not the answer;
- a memory-bound decode step time and a compute-bound prefill time (StepTimeModel) with a
  seeded run-level and step-level noise;
- speculative decoding (`EngineParams.spec`): a draft-and-verify iteration per decode step,
  each request keeping 1 + its accepted drafts, drawn from the profile's acceptance model;
- DP attention (`EngineParams.dp_groups`): that many schedulers with their own pools, requests
  dispatched round robin, stepping in lockstep (dpengine.py).

This module is the engine's public API; the parts live in one module each:

    scheduler.py   Engine: requests in, one iteration per step(), gauges out
    dpengine.py    DPEngine: DP attention's groups in lockstep; new_engine picks the engine
    schedtypes.py  EngineParams, Step, TokenEvent, EngineStats, EngineOOM, QueueFull
    schedstate.py  the mutable state an iteration changes (queues, new_token_ratio)
    schedreq.py    a request inside the scheduler and its finish reasons
    prefill.py     a prefill step: order the queue, form the batch, allocate, first tokens
    admission.py   SGLang's PrefillAdder: which waiting requests fit
    decode.py      a decode step, and retraction when the pool is full
    spec.py        speculative decoding's accept lengths and SGLang's counters of them
    kvpool.py      KV slot accounting over the radix cache (radix.py)
    timing.py      step times and their noise
    telemetry.py   log lines, lifetime counters, gen throughput
    closedloop.py  run_closed_loop: a closed-loop load in virtual time
"""

from __future__ import annotations

from tuner.sim.engine.closedloop import RequestTiming, SimRequest, run_closed_loop
from tuner.sim.engine.dpengine import DPEngine, new_engine
from tuner.sim.engine.schedtypes import (
    OOM_MESSAGE,
    EngineOOM,
    EngineParams,
    EngineStats,
    QueueFull,
    SpecParams,
    Step,
    TokenEvent,
)
from tuner.sim.engine.scheduler import Engine
from tuner.sim.engine.timing import StepTimeModel

__all__ = [
    "OOM_MESSAGE",
    "DPEngine",
    "Engine",
    "EngineOOM",
    "EngineParams",
    "EngineStats",
    "QueueFull",
    "RequestTiming",
    "SimRequest",
    "SpecParams",
    "Step",
    "StepTimeModel",
    "TokenEvent",
    "new_engine",
    "run_closed_loop",
]
