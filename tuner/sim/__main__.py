"""`python -m tuner.sim` / `tuner sim`: the simulated SGLang server.

Exit codes, as SGLang's process tree shows them to a shell:
  0    SIGTERM: drained and shut down
  1    an exception in the main process (argument check such as HiCache + --disable-radix-cache,
       ServerArgs' post-init refusing DP attention or speculative flags as SGLang's does,
       uvicorn failing to bind a port in use)
  2    argparse rejected a flag (one line, without argparse's 60-line usage), a bad `--sim-fault`
       spec or `--port`; a bad `--config` file, profile or `--sim-fault-state` file (one line
       naming file and key); a speculative algorithm the profile has no draft for, or a
       `--sim-acceptance` kind it lacks (argparse's form)
  137  a scheduler child failed (start-up OOM, HiCache host memory, prefill OOM under load): SGLang's
       parent SIGKILLs its whole tree, so a shell sees 128 + 9. The simulator exits with 137 rather
       than killing itself, so Popen sees 137 where real SGLang gives -9: classify both as a crash.
  -9   (137 in a shell) `--sim-fault crash-start` / `crash-load`: a SIGKILL with no message, the
       world's failure (faults.py)
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from tuner.errors import ModelConfigError, TunerError
from tuner.sim.faults import Faults, next_launch_index
from tuner.sim.flags import FlagError, parse_flags

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulated server until it exits; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = parse_flags(args)
        # after the parse: `--help` (which `tuner check` and `tuner tune` read) needs no server
        from tuner.sim.bootstrap import build_engine
        from tuner.sim.http.server import SimServer
        from tuner.sim.profile import load_profile
        from tuner.sim.startup import build_script

        profile = load_profile(ns.sim_profile)
        script = build_script(ns, profile)
        launch = next_launch_index(ns.sim_fault_state) if ns.sim_fault_state else 0
    except FlagError as exc:
        # one line: SGLang's usage text is 60 lines and the message alone names the flag
        sys.stderr.write(exc.message + "\n")
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except ModelConfigError as exc:  # before TunerError: it names the profile's file
        print(f"tuner sim: error: {ns.sim_profile}: model_config.{exc}", file=sys.stderr)
        return EXIT_USAGE
    except TunerError as exc:
        print(f"tuner sim: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    faults = Faults(ns.sim_fault, ns.sim_seed, launch)
    server = SimServer(ns, profile, script, lambda: build_engine(ns, profile, script), faults)
    if server.world is not None and server.world.rank > 0:  # a follower rank (sim/nodes.py)
        from tuner.sim.http.follower import run_follower

        return asyncio.run(run_follower(server))
    return asyncio.run(server.run())


if __name__ == "__main__":
    raise SystemExit(main())
