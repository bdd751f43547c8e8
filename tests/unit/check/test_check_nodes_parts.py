"""`tuner check` across nodes, its pure part: one line over every node's SGLang version, and
the node checks planned only for a study with target.nodes."""

from __future__ import annotations

from tests.helpers.studies import study_dict
from tuner.check.nodes import KEYS, same_version
from tuner.check.plan import CHECKS, planned
from tuner.config.load import parse_study


def test_one_version_everywhere_is_ok() -> None:
    line = same_version({"a:22": "0.5.6.post2", "b:22": "0.5.6.post2"})
    assert line.status == "ok" and line.detail == "0.5.6.post2 on every node"


def test_the_nodes_that_differ_are_named() -> None:
    line = same_version({"a:22": "0.5.6.post2", "b:22": "0.5.23", "c:22": "0.5.6.post2"})
    assert line.failed
    assert "b:22 has 0.5.23, the others 0.5.6.post2" in line.detail
    assert "a:22" not in line.detail
    tie = same_version({"a:22": "0.5.6.post2", "b:22": "0.5.23"})
    assert tie.failed and "b:22 has 0.5.23" in tie.detail  # nodes[0]'s is the reference


def test_node_checks_run_only_across_nodes() -> None:
    one = parse_study(study_dict(), "s.yaml")
    two = parse_study(
        study_dict(target={"nodes": ["a", "b"]}, server={"model-path": "m", "tp": 2}), "s.yaml"
    )
    assert not {c.key for c in planned(CHECKS, one)} & KEYS
    assert {c.key for c in planned(CHECKS, two)} >= KEYS
