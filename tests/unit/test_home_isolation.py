"""tests/conftest.py gives the session a temp HOME: no test can read the developer's ~/.ssh."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path


def test_home_is_the_session_temp_dir(isolated_home: Path) -> None:
    assert os.environ["HOME"] == str(isolated_home)
    assert Path.home() == isolated_home
    assert Path("~/.ssh").expanduser() == isolated_home / ".ssh"
    assert isolated_home.is_relative_to(Path(tempfile.gettempdir()))


def test_home_is_not_the_real_home(isolated_home: Path) -> None:
    real = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert Path.home() != real
    assert Path("~/.ssh").expanduser() != real / ".ssh"


def test_no_ssh_agent_and_no_xdg_dirs_outside_home() -> None:
    assert "SSH_AUTH_SOCK" not in os.environ
    assert not {"XDG_CACHE_HOME", "XDG_CONFIG_HOME"} & set(os.environ)


def test_subprocesses_inherit_the_temp_home(isolated_home: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import pathlib; print(pathlib.Path.home())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert out == str(isolated_home)
