"""Audit finding 4: only names that END in key/token/secret/password are secrets; SGLang's own
flags with "token" inside (or a number's flag ending in it) are launched as any flag."""

from __future__ import annotations

import pytest

from tuner.server.launch import build_launch, is_secret_name, is_secret_variable, shown_command


@pytest.mark.parametrize(
    "name",
    [
        "tbo-token-distribution-threshold",
        "ds-heavy-token-num",
        "speculative-token-map",
        "bucket-time-to-first-token",  # a float: ends in token, holds no secret
        "bucket-inter-token-latency",
        "prefill-delayer-token-usage-low-watermark",
        "kt-max-deferred-experts-per-token",  # an int
        "max-total-tokens",
        "tokenizer-path",
        "ssl-keyfile",
    ],
)
def test_sglang_flags_with_token_inside_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["api-key", "admin-api-key", "hf-token", "db-password", "ssl-keyfile-password", "my-secret"],
)
def test_names_ending_in_a_secret_word_are_secrets(name: str) -> None:
    assert is_secret_name(name) and is_secret_name(f"--{name}")


def test_a_flag_with_token_inside_reaches_the_command_line_unmasked() -> None:
    spec = build_launch(
        ["python", "-m", "sglang.launch_server"],
        {"tbo-token-distribution-threshold": 0.5, "ds-heavy-token-num": 256, "api-key": "s3cr3t!"},
        30000,
    )
    shown = shown_command(spec.argv)
    assert "--tbo-token-distribution-threshold 0.5" in shown
    assert "--ds-heavy-token-num 256" in shown
    assert spec.secret_flags == {"api-key": "s3cr3t!"} and "s3cr3t!" not in " ".join(spec.argv)


def test_environment_values_of_secret_looking_variables_stay_masked() -> None:
    spec = build_launch(
        ["x"],
        {},
        30000,
        env={"HF_TOKEN": "hf_abcdef", "AWS_SECRET_ACCESS_KEY_ID": "AKIAXYZW", "NCCL_DEBUG": "INFO"},
    )
    assert spec.secret_values() == {"hf_abcdef", "AKIAXYZW"}
    assert is_secret_variable("HF_TOKEN") and not is_secret_variable("NCCL_DEBUG")
