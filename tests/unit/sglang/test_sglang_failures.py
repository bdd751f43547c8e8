"""tuner.sglang.failures: the failure classes, and the package's one-way, I/O-free imports.

The classification itself is tested against SGLang's messages in test_server_classify.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tuner.sglang.failures import READY_LINE, WEIGHTS_LOADED_LINE, FailureClass, explain_failure

PACKAGE = REPO / "tuner" / "sglang"


def test_failure_classes_are_the_stored_strings() -> None:
    assert [c.value for c in FailureClass] == [
        "oom_cuda_graph",
        "oom_runtime",
        "not_enough_memory",
        "host_memory",
        "bad_flag",
        "port_in_use",
        "timeout",
        "crashed",
        "stale_server",
        "args_mismatch",
    ]
    assert FailureClass.BAD_FLAG == "bad_flag" and f"{FailureClass.TIMEOUT}" == "timeout"


def test_the_class_is_the_enum() -> None:
    cls, reason = explain_failure(2, ["launch_server.py: error: unrecognized arguments: --x"])
    assert cls is FailureClass.BAD_FLAG and reason.endswith("--x")


@pytest.mark.parametrize(
    ("pattern", "line"),
    [
        (READY_LINE, "[2026-01-12 10:00:09] The server is fired up and ready to roll!"),
        (WEIGHTS_LOADED_LINE, "[2026-01-12 10:00:03 TP0] Load weight end. type=LlamaForCausalLM"),
        (WEIGHTS_LOADED_LINE, "[2026-01-12 10:00:04 TP0] KV Cache is allocated. #tokens: 450000"),
    ],
)
def test_start_up_milestones(pattern, line: str) -> None:
    assert pattern.search(line)


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_package_is_knowledge_not_io() -> None:
    """No simulator (it imports us), no I/O library: only the stdlib's pure parts and ours."""
    allowed_ours = {"tuner.errors"}
    io_stdlib = {"os", "subprocess", "socket", "urllib", "http", "asyncio", "shutil", "pathlib"}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "extract.py":  # a developer tool reading SGLang's source; see below
            continue
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "tuner":
                assert name in allowed_ours or name.startswith("tuner.sglang"), (path, name)
            else:
                assert top in sys.stdlib_module_names and top not in io_stdlib, (path, name)


def test_the_extractor_is_a_tool_nothing_imports() -> None:
    """tuner.sglang.extract reads files (SGLang's source) when a developer regenerates the
    tables; the product reads the JSON it wrote, never the extractor."""
    importers = [
        p
        for p in sorted(PACKAGE.parent.rglob("*.py"))
        if p.name != "extract.py" and "tuner.sglang.extract" in _imports(p)
    ]
    assert importers == []


def test_the_evidence_of_a_death_is_found_under_the_access_log_that_followed_it() -> None:
    """A death under load: SGLang's message, then the HTTP server answering 503 for a while.
    A tail of the last 40 lines held only access lines (a 'crash' without evidence, the
    world's); the evidence tail drops them and keeps the message (the configuration's)."""
    from tuner.sglang.failures import evidence_tail

    log = [
        "[2026-12-03 18:52:07] Prefill batch, #new-seq: 4, #new-token: 4096, #cached-token: 0,",
        "[2026-12-03 18:52:07] Scheduler hit an exception: Traceback (most recent call last):",
        "RuntimeError: Prefill out of memory. Try to lower your batch size.",
        "",
        "[2026-12-03 18:52:07] Received sigquit from a child process. It usually means the child failed.",
    ] + [
        f'INFO:     127.0.0.1:{60000 + i} - "POST /generate HTTP/1.1" 503 Service Unavailable'
        for i in range(160)
    ]
    assert explain_failure(137, log[-40:])[0] == FailureClass.CRASHED  # what 40 lines said
    tail = evidence_tail(log, 40)
    assert len(tail) == 5 and not any("POST /generate" in ln for ln in tail)
    assert explain_failure(137, tail)[0] == FailureClass.OOM_RUNTIME
    assert evidence_tail(["a", "b", "c"], 2) == ["b", "c"] and evidence_tail(["a"], 0) == []
