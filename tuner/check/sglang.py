"""The SGLang on the host: its version, and its own flag set from `<launch> --help`.

Version probe. The launch must be `PYTHON... -m MODULE`: the probe runs that Python with the
server's environment and workdir and prints `__version__` of the module's package. For
`sglang.launch_server` that is `import sglang; print(sglang.__version__)`. A module outside the
`sglang` package must itself say which SGLang it speaks by a `__version__` attribute: the
simulator (`-m tuner.sim`) does, with the version of the flag table its parser is built from.
Any other launch (a script, `sglang serve`) gets a warning and no version.

Flags. `<launch> --help` is SGLang's argparse help, read as it is on the host (its version, its
plugins): every name under `server:`, `space:` and `baseline:` (the latter are names of the
space), plus `--port` (tuner always passes it) and `--config` (the API key's file), must select
an option string there as argparse selects one (exact, alias, unique prefix).

A server in a container (`target.container`) runs the image's SGLang: neither is probed on the
host (starting the image, maybe pulling it, is no quick probe); both lines say so.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.check.flagset import flag_problem, help_options
from tuner.check.lines import CheckLine, fail, ok, skip, warn
from tuner.check.probe import Probe, said
from tuner.config.schema import StudyConfig
from tuner.config.space import CLIENT_PARAMS
from tuner.errors import ConfigError, SetupError
from tuner.sglang.flags import KNOWN_VERSIONS

_VERSION_CODE = (
    "import importlib, sys; m = importlib.import_module(sys.argv[1]); "
    "print(getattr(m, '__version__', ''))"
)


def python_module(template: Sequence[str]) -> tuple[list[str], str] | None:
    """(the argv before `-m`, the module after it), or None when the launch is not `-m`."""
    argv = list(template)
    if "-m" not in argv[:-1] or argv.index("-m") == 0:
        return None
    i = argv.index("-m")
    return argv[:i], argv[i + 1]


def version_package(module: str) -> str:
    """The package whose `__version__` is the SGLang version: `sglang` for its entry points."""
    return "sglang" if module == "sglang" or module.startswith("sglang.") else module


def in_container(p: Probe, name: str) -> CheckLine | None:
    """A skip line when the server runs in a container: its SGLang is the image's, not the
    host's, and starting the image (maybe pulling it) is no quick probe."""
    section = p.cfg.target.container
    if section is None:
        return None
    return skip(name, f"runs in {section.image} (target.container): not probed on the host")


def version(p: Probe) -> CheckLine:
    """The SGLang version the launch's Python imports (see the module docstring)."""
    if (line := in_container(p, "sglang")) is not None:
        return line
    found = python_module(p.launch.template)
    if found is None:
        return warn(
            "sglang",
            "target.launch is not `python -m MODULE`: the version is not probed "
            "(flags are still checked against its --help)",
        )
    python, module = found
    package = version_package(module)
    res = p.run_as_server([*python, "-c", _VERSION_CODE, package], p.deadlines.version_s)
    shown = " ".join(python)
    if res.exit_code == 127:
        return fail(
            "sglang",
            f"{shown} is not found on {p.where} ({said(res)}); fix target.launch (a full "
            "path works) or target.env's PATH",
            SetupError,
        )
    if not res.ok:
        return fail(
            "sglang",
            f"{package} does not import with {shown} on {p.where} ({said(res)}); install "
            "SGLang for that Python, or fix target.launch / target.env",
            SetupError,
        )
    found_version = res.stdout.strip().splitlines()[-1:] or [""]
    v = found_version[0].strip()
    if not v:
        return warn("sglang", f"{package} imports but has no __version__: version unknown")
    p.facts["sglang_version"] = v
    known = "" if v in KNOWN_VERSIONS else f"; tuner's tables know {', '.join(KNOWN_VERSIONS)}"
    return ok("sglang", f"{v} ({package}, {shown}){known}")


def study_flags(cfg: StudyConfig) -> dict[str, str]:
    """Flag name -> where the study names it (first place), for every flag the night passes."""
    out: dict[str, str] = {}
    for section, names in (("server", cfg.server), ("space", cfg.space)):
        for name in names:
            if name not in CLIENT_PARAMS:
                out.setdefault(name, f"{section}.{name}")
    for name in cfg.baseline or {}:  # the schema keeps them inside the space
        if name not in CLIENT_PARAMS:
            out.setdefault(name, f"baseline.{name}")
    out.setdefault("port", "target.port (--port)")
    if cfg.target.api_key_env:
        out.setdefault("config", "target.api_key_env (--config, the key's file)")
    return out


def flags(p: Probe) -> CheckLine:
    """Every flag the study passes resolves on the host's own SGLang (its --help)."""
    if (line := in_container(p, "flags")) is not None:
        return line
    argv = [*p.launch.template, "--help"]
    res = p.run_as_server(argv, p.deadlines.help_s)
    shown = " ".join([*p.cfg.target.launch, "--help"])
    if not res.ok:
        return fail(
            "flags",
            f"`{shown}` exited {res.exit_code} on {p.where} ({said(res)}); fix target.launch "
            "(the program, its Python, target.env) or install SGLang there",
            SetupError,
        )
    options = help_options(res.stdout or res.stderr)
    if not options:
        return fail(
            "flags",
            f"`{shown}` printed no --options on {p.where}: is target.launch SGLang's "
            "launch_server?",
            SetupError,
        )
    p.facts["host_options"] = options
    wanted = study_flags(p.cfg)
    problems = [
        f"{where}: {problem}"
        for name, where in wanted.items()
        if (problem := flag_problem(name, options)) is not None
    ]
    if problems:
        return fail("flags", f"{p.cfg.source}: " + "; ".join(problems), ConfigError)
    return ok(
        "flags",
        f"{len(wanted)} flags resolve on the host's SGLang ({len(options)} option strings "
        "in its --help)",
    )
