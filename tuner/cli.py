"""tuner: find the SGLang launch flags that give the most throughput, by measurement.

Each subcommand lives in `tuner/commands/<name>.py` with `register(subparsers)` and `run(args)`;
heavy imports stay inside `run` so `tuner --help` is fast. `tuner sim` hands its whole argument
list to the simulator, whose parser speaks SGLang's flags.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
from collections.abc import Sequence

from tuner import __version__
from tuner.errors import HaltError, InfraError, TunerError, one_line

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


#: a full disk, as OSError says it (ENOSPC) and as a quota does (EDQUOT)
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def storage_failure(exc: BaseException, args: argparse.Namespace | None) -> str | None:
    """The one line for a study the world stopped writing: a full disk (OSError ENOSPC), the
    study's database failing (optuna's StorageInternalError, SQLAlchemy's OperationalError),
    also when optuna's own bookkeeping then trips over it (an AssertionError raised inside
    optuna while that failure is being handled). None for anything else: a bug keeps its
    traceback. The study stays as the database has it: rerunning resumes it."""
    chain, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    kinds = _storage_errors()
    if not isinstance(exc, (OSError, *kinds)) and not _optuna_assertion(exc):
        return None
    for e in chain:
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            where = f" {e.filename}" if e.filename else ""
            return f"cannot write{where}: {e.strerror}{_resume(args, 'make room')}"
    failed = [e for e in chain if isinstance(e, kinds)]
    if not failed:
        return None
    # SQLAlchemy's error keeps the database's own words (`orig`); optuna's wraps it
    e = next((e for e in failed if getattr(e, "orig", None) is not None), failed[0])
    orig = getattr(e, "orig", None) or e
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    reason = lines[0] if lines else type(orig).__name__
    db = _database(args)
    if "full" in reason:  # SQLite's "database or disk is full"
        where = db or "the study's database"
        return f"cannot write {where}: {reason}{_resume(args, 'make room')}"
    where = f" {db}" if db else ""
    return f"the study's database{where} failed: {reason}{_resume(args, 'fix it')}"


def _storage_errors() -> tuple[type[BaseException], ...]:
    """The storage's exception types, from the modules already imported (none imported here)."""
    kinds: list[type[BaseException]] = []
    if (optuna_exc := sys.modules.get("optuna.exceptions")) is not None:
        kinds.append(optuna_exc.StorageInternalError)
    if (sa_exc := sys.modules.get("sqlalchemy.exc")) is not None:
        kinds.append(sa_exc.OperationalError)
    return tuple(kinds)


def _optuna_assertion(exc: BaseException) -> bool:
    """An AssertionError raised in optuna's own code (its trial bookkeeping's "Should not
    reach" after a failed write), not in tuner's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (
        isinstance(exc, AssertionError)
        and tb is not None
        and "/optuna/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")
    )


def _database(args: argparse.Namespace | None) -> str | None:
    """The study's database as the user knows it (a SQLite file's path, a masked URL)."""
    try:
        from tuner.study import masked, storage_url
        from tuner.studyfile import load_study

        cfg = load_study(args.study_file)  # type: ignore[union-attr]
        url = storage_url(cfg, args.runs_dir, getattr(args, "storage", None))  # type: ignore[union-attr]
    except Exception:  # no study at hand, or it cannot be read again
        return None
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else masked(url)


def _resume(args: argparse.Namespace | None, first: str) -> str:
    """How a stopped study goes on (`tune` only: the other commands simply run again)."""
    if getattr(args, "command", None) != "tune":
        return ""
    return f" ({first}, then run the same command again to resume)"
