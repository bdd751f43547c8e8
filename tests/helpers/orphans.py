"""Servers a test starts end with the test process, even when pytest itself is SIGKILLed.

`DIE_WITH_PARENT` prefixes a command with util-linux's `setpriv --pdeathsig TERM`: the kernel
sends SIGTERM to the server when the process that spawned it dies, so a killed pytest worker
leaves no sshd or simulator holding a port (fixtures' `finally` never runs after SIGKILL).
setpriv execs the command, so the child's pid and process group are the server's own. Only for
children spawned from a thread that lives as long as they should: the signal follows the
spawning *thread*. Empty where setpriv is missing (the fixtures' own cleanup still runs).
"""

from __future__ import annotations

import shutil

_SETPRIV = shutil.which("setpriv")
DIE_WITH_PARENT: list[str] = [_SETPRIV, "--pdeathsig", "TERM", "--"] if _SETPRIV else []
