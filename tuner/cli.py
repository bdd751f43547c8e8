"""tuner: find the SGLang launch flags that give the most throughput, by measurement.

Each subcommand lives in `tuner/commands/<name>.py` with `register(subparsers)` and `run(args)`;
heavy imports stay inside `run` so `tuner --help` is fast. `tuner sim` hands its whole argument
list to the simulator, whose parser speaks SGLang's flags.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from tuner import __version__
from tuner.errors import HaltError, InfraError, TunerError, one_line
from tuner.study.storage_failure import storage_failure

COMMANDS = ("check", "tune", "status", "export", "report", "capacity", "bench", "sim")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: what `tuner --help` tells a user (the module docstring above is for developers)
DESCRIPTION = """\
Find the SGLang launch flags that give the most throughput within your latency SLOs.

tuner restarts an SGLang server (on this machine or over SSH) with each configuration an
Optuna study proposes, measures it under a load like bench_serving's, learns which
configurations cannot start or miss their SLOs, and exports the winner as SGLang's own
--config YAML."""

EPILOG = """\
a night, step by step:
  tuner check study.yaml            the study file, host, SGLang, GPUs and port, before the night
  tuner tune study.yaml             run the study (run it again to resume)
  tuner status study.yaml           the trials so far and the best (--wide, --json)
  tuner export study.yaml -o best.yaml
                                    the winner as SGLang --config YAML (--format cmd, json, csv)
  tuner report study.yaml           an HTML report of the study

no GPU at hand? tuner tune search_spaces/demo-sim.yaml runs a whole study against the simulator.
'tuner COMMAND --help' describes each command."""


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus a message; a user mistake here gets one line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tuner",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"tuner.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tuner` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = None
    # paramiko's transport thread logs a traceback for every connection a down host refuses
    # (and a line for each forward the server's port refused while it started): the tuner
    # says what failed in its own one line, so they stay off the user's terminal
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    try:
        if args_list[:1] == ["sim"]:
            from tuner.sim.__main__ import main as sim_main

            return sim_main(args_list[1:])
        args = build_parser().parse_args(args_list)
        return int(args.run(args) or EXIT_OK)
    except TunerError as exc:
        print(f"tuner: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except InfraError as exc:
        print(f"tuner: failed: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except HaltError as exc:
        print(
            f"tuner: stopped: {one_line(str(exc))} (run the same command again to resume)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception as exc:
        why = storage_failure(exc, args)
        if why is None:  # a bug: its traceback is what a report of it needs
            raise
        print(f"tuner: failed: {one_line(why)}", file=sys.stderr)
        return EXIT_FAILED
