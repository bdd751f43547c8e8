"""SSH option resolution (ssh_config aliases, explicit options win, ProxyJump) and script quoting."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.hosts import SSHHost, SSHOptions
from tuner.hosts.base import detached_script, quote_argv
from tuner.hosts.ssh import _parse_jump, _resolve


def config(tmp_path: Path) -> Path:
    key = tmp_path / "id_test"
    key.write_text("not a real key")
    p = tmp_path / "ssh_config"
    p.write_text(
        f"Host gpu\n  HostName 10.0.0.7\n  User ubuntu\n  Port 2200\n  IdentityFile {key}\n"
        "  ProxyJump ops@bastion:2222\n\nHost direct\n  HostName 10.0.0.8\n  ProxyJump none\n"
    )
    return p


def test_alias_is_resolved_from_the_given_config(tmp_path: Path) -> None:
    r = _resolve(SSHOptions(host="gpu", ssh_config=str(config(tmp_path))))
    assert (r.hostname, r.user, r.port) == ("10.0.0.7", "ubuntu", 2200)
    assert r.identity_files == (str(tmp_path / "id_test"),)
    assert r.proxyjump == "ops@bastion:2222"


def test_explicit_options_win_over_the_config(tmp_path: Path) -> None:
    r = _resolve(SSHOptions(host="gpu", user="root", port=22, ssh_config=str(config(tmp_path))))
    assert (r.user, r.port) == ("root", 22)


def test_no_config_means_the_name_is_the_host(tmp_path: Path) -> None:
    r = _resolve(SSHOptions(host="gpu", user="me", ssh_config=""))
    assert (r.hostname, r.port, r.proxyjump, r.identity_files) == ("gpu", 22, None, ())
    assert _resolve(SSHOptions(host="direct", ssh_config=str(config(tmp_path)))).proxyjump is None


def test_host_name_for_messages(tmp_path: Path) -> None:
    h = SSHHost(SSHOptions(host="gpu", ssh_config=str(config(tmp_path))))
    assert (h.name, h.address) == ("ssh ubuntu@10.0.0.7:2200", "10.0.0.7")


def test_missing_identity_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"target\.ssh\.identity_file: .*does not exist"):
        _resolve(SSHOptions(host="h", identity_file=str(tmp_path / "nope"), ssh_config=""))


def test_password_env_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_TEST_PW", raising=False)
    h = SSHHost(SSHOptions(host="h", user="u", ssh_config="", password_env="TUNER_TEST_PW"))
    with pytest.raises(ConfigError, match="TUNER_TEST_PW is not set"):
        h._password()
    monkeypatch.setenv("TUNER_TEST_PW", "s3cret")
    assert h._password() == "s3cret"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("bastion", ("bastion", None, None)),
        ("ops@bastion:2222", ("bastion", "ops", 2222)),
        ("a@j1:22,j2", ("j1", "a", 22)),
    ],
)
def test_parse_jump(spec: str, expected: tuple) -> None:
    assert _parse_jump(spec) == expected


def test_quote_argv_round_trips_through_the_shell() -> None:
    argv = ["printf", "%s|", "a b", "$(id)", "x; touch /tmp/nope", "'", ""]
    out = subprocess.run(["bash", "-c", quote_argv(argv)], capture_output=True, text=True).stdout
    assert out == "a b|$(id)|x; touch /tmp/nope|'||"


def test_detached_script_takes_hostile_paths_literally(tmp_path: Path) -> None:
    d = tmp_path / "a b $(touch PWNED) `touch PWNED2`"
    log = d / "logs" / "it's.log"
    d.mkdir()
    script = detached_script("pwd; exit 4", log_path=str(log), cwd=str(d), nonce="n1")
    pid = int(subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout)
    deadline = time.monotonic() + 10
    while not Path(str(log) + ".exit").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert Path(str(log) + ".exit").read_text() == "4\n"
    assert log.read_text() == f"{d}\n"
    assert Path(str(log) + ".pid").read_text() == f"{pid} n1\n"
    assert not list(Path.cwd().glob("PWNED*")) and not list(tmp_path.glob("PWNED*"))
    # a rerun with the same nonce (a retried start) reports the same pid, starts nothing
    again = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout
    assert int(again) == pid
