"""Session-wide test hygiene: an isolated HOME, and the shared fixtures.

HOME points to a fresh temp dir from `pytest_configure` (before collection and before any session
fixture) until `pytest_unconfigure`, so no test, and no subprocess a test starts, can read the
developer's ~/.ssh, ~/.cache or ~/.config. Tests that need SSH files get them from the
`sshd_server` fixture, which names every file explicitly.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

# fixtures (sshd_server, any_host, reaped_groups, postgres_url) found by name in every test
pytest_plugins = ["tests.helpers.sshd", "tests.helpers.pg"]

#: the temp HOME and the MonkeyPatch that set it, kept on the config (not in a global)
_HOME = pytest.StashKey[tuple[Path, pytest.MonkeyPatch]]()

#: variables that would point a library back into the real home or at the user's SSH agent
_UNSET = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "SSH_AUTH_SOCK")


def pytest_configure(config: pytest.Config) -> None:
    """Point HOME at an empty temp dir for the whole session."""
    home = Path(tempfile.mkdtemp(prefix="tuner-test-home-"))
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home))
    for name in _UNSET:
        mp.delenv(name, raising=False)
    config.stash[_HOME] = (home, mp)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Restore the environment and remove the temp HOME."""
    home, mp = config.stash[_HOME]
    mp.undo()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def isolated_home(pytestconfig: pytest.Config) -> Path:
    """The temp dir HOME points to during this session."""
    return pytestconfig.stash[_HOME][0]
