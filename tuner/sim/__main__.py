"""`python -m tuner.sim` / `tuner sim`: the simulated SGLang server.

Exit codes, as SGLang's process tree shows them to a shell:
  0    SIGTERM: drained and shut down
  1    an exception in the main process (argument check such as HiCache + --disable-radix-cache,
       uvicorn failing to bind a port in use)
  2    argparse rejected a flag; a bad `--config` file or profile (one line naming file and key)
  137  a scheduler child failed (start-up OOM, HiCache host memory, prefill OOM under load): SGLang's
       parent SIGKILLs its whole tree, so a shell sees 128 + 9. The simulator exits with 137 rather
       than killing itself, so Popen sees 137 where real SGLang gives -9: classify both as a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from tuner.capacity import ModelConfigError
from tuner.errors import TunerError
from tuner.sim.flags import FlagError, parse_flags
from tuner.sim.profile import Profile, load_profile
from tuner.sim.startup import Script, build_script

EXIT_USAGE = 2


def engine_params(ns: argparse.Namespace, script: Script) -> Any:
    """EngineParams of a started server: capacity from the start-up plan, the rest from flags."""
    from tuner.sim.engine import EngineParams

    plan = script.plan
    assert plan is not None
    d = script.defaults
    return EngineParams(
        max_total_tokens=plan.max_total_num_tokens,
        max_running_requests=plan.max_running_requests,
        page_size=ns.page_size,
        chunked_prefill_size=d.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        schedule_conservativeness=ns.schedule_conservativeness,
        schedule_policy=ns.schedule_policy,
        radix_cache=not ns.disable_radix_cache,
        hicache_host_tokens=script.hicache.host_tokens if script.hicache else 0,
        hicache_write_policy=ns.hicache_write_policy,
        context_len=d.context_len,
        decode_log_interval=ns.decode_log_interval,
        oom_prefill_tokens=plan.oom_prefill_tokens,
        max_queued_requests=ns.max_queued_requests,
        seed=ns.sim_seed,
        # decode batches above the captured size run without CUDA graphs (slower)
        cuda_graph_max_bs=0 if ns.disable_cuda_graph else d.cuda_graph_max_bs,
    )


def build_engine(ns: argparse.Namespace, profile: Profile, script: Script) -> Any:
    """The engine for a started server (the same one `run_closed_loop` builds from these params)."""
    from tuner.sim.engine import Engine, StepTimeModel

    assert script.plan is not None
    timing = StepTimeModel.from_mapping(profile.timing)
    return Engine(engine_params(ns, script), timing, script.plan.bytes_per_token, seed=ns.sim_seed)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulated server until it exits; returns the process exit code."""
    from tuner.sim.realtime import SimServer

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = parse_flags(args)
        profile = load_profile(ns.sim_profile)
        script = build_script(ns, profile)
    except FlagError as exc:
        sys.stderr.write(exc.usage + exc.message + "\n")
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except TunerError as exc:
        print(f"tuner sim: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModelConfigError as exc:
        print(f"tuner sim: error: {ns.sim_profile}: model_config.{exc}", file=sys.stderr)
        return EXIT_USAGE
    server = SimServer(ns, profile, script, lambda: build_engine(ns, profile, script))
    return asyncio.run(server.run())


if __name__ == "__main__":
    raise SystemExit(main())
