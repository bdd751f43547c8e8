"""Workload shapes (lengths, prefix sharing, turn history), determinism, dataset errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.helpers.paths import DATA
from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.workload import WorkloadSection
from tuner.errors import ConfigError, InputFileError
from tuner.loadgen.workload import Request, requests_for


def _build(w: WorkloadSection) -> list[Request]:
    """The requests of `w`, 1000 of them when it sets no count (bench_serving's default)."""
    return requests_for(w, num_requests=1000)


def test_random_lengths_follow_bench_serving_rule() -> None:
    spec = WorkloadSection(num_requests=500, input_len=100, output_len=40, range_ratio=0.5, seed=1)
    reqs = _build(spec)
    assert len(reqs) == 500
    assert all(50 <= r.prompt_len <= 100 for r in reqs)
    assert all(20 <= r.output_len <= 40 for r in reqs)
    assert all(r.token_ids is not None and len(r.token_ids) == r.prompt_len for r in reqs)
    # uniform, not constant: both ends of the range show up
    assert min(r.prompt_len for r in reqs) <= 55 and max(r.prompt_len for r in reqs) >= 95


def test_ratio_zero_goes_down_to_one_and_fixed_is_fixed() -> None:
    reqs = _build(
        WorkloadSection(num_requests=400, input_len=4, output_len=4, range_ratio=0.0, seed=2)
    )
    assert {r.prompt_len for r in reqs} == {1, 2, 3, 4}
    fixed = _build(WorkloadSection(num_requests=50, input_len=7, output_len=3, range_ratio=1.0))
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(7, 3)}
    also = _build(WorkloadSection(num_requests=50, input_len=7, length_dist="fixed"))
    assert {r.prompt_len for r in also} == {7}


def test_lognormal_lengths_are_clipped_and_centred() -> None:
    reqs = _build(
        WorkloadSection(num_requests=2000, input_len=100, output_len=10, length_dist="lognormal")
    )
    lens = sorted(r.prompt_len for r in reqs)
    assert lens[0] >= 1 and lens[-1] <= 400
    assert 85 <= lens[len(lens) // 2] <= 115


@pytest.mark.parametrize("kind", ["random", "shared-prefix", "multi-turn"])
def test_same_seed_same_requests_other_seed_differs(kind: str) -> None:
    spec = WorkloadSection(
        kind=kind,
        num_requests=12,
        input_len=20,
        output_len=5,
        num_groups=3,
        prompts_per_group=4,
        prefix_len=10,
        question_len=3,
        turns=3,
        seed=7,
    )
    assert _build(spec) == _build(spec)
    other = spec.model_copy(update={"seed": 8})
    assert _build(other) != _build(spec)


def test_shared_prefix_groups_share_exactly_the_prefix() -> None:
    spec = WorkloadSection(
        kind="shared-prefix",
        num_groups=5,
        prompts_per_group=6,
        prefix_len=30,
        question_len=7,
        output_len=9,
        seed=3,
    )
    reqs = _build(spec)
    assert len(reqs) == 30 and [r.index for r in reqs] == list(range(30))
    assert all(r.prompt_len == 37 and r.output_len == 9 for r in reqs)
    groups: dict[int, list[Request]] = {}
    for r in reqs:
        groups.setdefault(r.group, []).append(r)
    assert sorted(groups) == [0, 1, 2, 3, 4] and all(len(g) == 6 for g in groups.values())
    prefixes = {g: {r.token_ids[:30] for r in rs} for g, rs in groups.items()}
    assert all(len(p) == 1 for p in prefixes.values())  # one prefix per group
    assert len({next(iter(p)) for p in prefixes.values()}) == 5  # distinct across groups
    # shuffled: groups interleave rather than arriving one after the other
    assert [r.group for r in reqs] != sorted(r.group for r in reqs)


def test_shared_prefix_bench_serving_defaults() -> None:
    spec = WorkloadSection(kind="shared-prefix")
    assert (spec.num_groups, spec.prompts_per_group, spec.prefix_len, spec.question_len) == (
        64,
        16,
        2048,
        128,
    )


def test_multi_turn_history_grows_by_output_and_question() -> None:
    spec = WorkloadSection(
        kind="multi-turn",
        num_requests=9,
        turns=3,
        input_len=20,
        output_len=6,
        question_len=4,
        range_ratio=1.0,
        seed=5,
    )
    reqs = _build(spec)
    assert len(reqs) == 9 and [r.index for r in reqs] == list(range(9))
    # round-robin: all first turns, then all second turns
    assert [r.turn for r in reqs] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for conv in range(3):
        turns = sorted((r for r in reqs if r.conversation == conv), key=lambda r: r.turn)
        for a, b in itertools.pairwise(turns):
            assert b.token_ids[: a.prompt_len] == a.token_ids  # resends the history
            assert b.prompt_len == a.prompt_len + a.output_len + 4
    assert {r.prompt_len for r in reqs if r.turn == 0} == {20}


def test_prompt_text_is_one_word_per_token() -> None:
    r = _build(WorkloadSection(num_requests=1, input_len=12, range_ratio=1.0))[0]
    words = r.prompt_text().split()
    assert len(words) == 12 and all(w.startswith("w") for w in words)


def test_sharegpt_json_and_jsonl() -> None:
    reqs = _build(
        WorkloadSection(
            kind="sharegpt",
            dataset=str(DATA / "sharegpt_sample.json"),
            num_requests=10,
            shuffle=False,
        )
    )
    # record c has no reply and is skipped; prompt = first human turn; output = reply length
    assert [r.text for r in reqs] == [
        "What is the capital of France?",
        "Write a haiku about autumn leaves falling",
        "Explain KV caches in one sentence.",
    ]
    assert [r.output_len for r in reqs] == [6, 13, 16]
    assert [r.prompt_len for r in reqs] == [6, 7, 6]
    lines = _build(
        WorkloadSection(
            kind="sharegpt",
            num_requests=1,
            seed=4,
            dataset=str(DATA / "sharegpt_sample.jsonl"),
        )
    )
    assert len(lines) == 1 and lines[0].text in ("hello there friend", "count to five")
    fixed = _build(
        WorkloadSection(
            kind="sharegpt", dataset_output_len=32, dataset=str(DATA / "sharegpt_sample.json")
        )
    )
    assert {r.output_len for r in fixed} == {32}


def test_jsonl_prompts_default_max_tokens() -> None:
    reqs = _build(
        WorkloadSection(
            kind="jsonl", dataset=str(DATA / "prompts.jsonl"), output_len=77, shuffle=False
        )
    )
    assert [(r.text, r.output_len) for r in reqs] == [
        ("Summarise the plot of Hamlet.", 64),
        ("List three prime numbers.", 8),
        ("Say hi.", 77),
    ]


@pytest.mark.parametrize(
    ("name", "kind", "match"),
    [
        ("prompts_bad.jsonl", "jsonl", r"prompts_bad\.jsonl:3: invalid JSON"),
        ("prompts_bad_tokens.jsonl", "jsonl", r"prompts_bad_tokens\.jsonl:2: 'max_tokens' must be"),
        ("prompts.jsonl", "sharegpt", r"prompts\.jsonl:1: record has no 'conversations'"),
        ("missing.jsonl", "jsonl", r"missing\.jsonl: cannot read"),
    ],
)
def test_malformed_files_name_file_and_line(name: str, kind: str, match: str) -> None:
    with pytest.raises(InputFileError, match=match) as info:
        _build(WorkloadSection(kind=kind, dataset=str(DATA / name)))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[" * 100_000 + "]" * 100_000, r"d\.jsonl: invalid JSON: nested too deeply"),
        ('{"prompt": ' + "[" * 100_000, r"d\.jsonl:1: invalid JSON: nested too deeply"),
        ('{"prompt": "hi", "max_tokens": ' + "9" * 40 + "}", r"d\.jsonl:1: 'max_tokens' must be"),
        ('{"prompt": "  "}', r"d\.jsonl:1: 'prompt' is empty"),
    ],
)
def test_fuzzed_records_are_named(tmp_path: Path, text: str, match: str) -> None:
    """Found by fuzzing: a RecursionError traceback, and records every server would refuse."""
    f = tmp_path / "d.jsonl"
    f.write_text(text + "\n")
    with pytest.raises(InputFileError, match=match):
        _build(WorkloadSection(kind="jsonl", dataset=str(f)))


def test_bad_json_array_names_record(tmp_path: Path) -> None:
    f = tmp_path / "d.json"
    f.write_text('[{"conversations": [{"from": "human", "value": "x"}, {"value": "y"}]}]')
    with pytest.raises(InputFileError, match=r"d\.json: record 1: a turn lacks 'from'"):
        _build(WorkloadSection(kind="sharegpt", dataset=str(f)))


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"kind": "zipf"}, "workload.kind"),
        ({"input_len": 0}, "workload.input_len"),
        ({"range_ratio": 1.5}, "workload.range_ratio"),
        ({"kind": "jsonl"}, "workload.dataset"),
        ({"turns": 0}, "workload.turns"),
        ({"length_dist": "zipf"}, "workload.length_dist"),
        ({"dataset_output_len": 0}, "workload.dataset_output_len"),
    ],
)
def test_bad_spec_is_a_config_error(kwargs: dict, key: str) -> None:
    # the checks are the study file's (config.WorkloadSection), naming its keys
    study = study_dict(space={"mem-fraction-static": {"low": 0.5, "high": 0.9}}, workload=kwargs)
    with pytest.raises(ConfigError, match=key):
        parse_study(study)


def test_the_count_is_the_sections_else_the_callers() -> None:
    w = WorkloadSection(input_len=4, output_len=4)
    assert len(requests_for(w, num_requests=30)) == 30
    assert len(requests_for(w.model_copy(update={"num_requests": 7}), num_requests=30)) == 7
    # shared-prefix: groups x prompts, whatever the count
    sp = WorkloadSection(kind="shared-prefix", num_groups=2, prompts_per_group=3, prefix_len=4)
    assert len(requests_for(sp, num_requests=30)) == 6
