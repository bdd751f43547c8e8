"""Being told when the night ends: a command run with a JSON summary on its stdin.

`tuner tune --notify CMD` (or the study file's `notify:` section) runs CMD with `sh -c` on the
machine running the tuner when the run ends, fails or stops early (a halt, Ctrl-C, SIGTERM).
The summary (tuner/report/summary.py) arrives on stdin; CMD sees the tuner's environment, plus
`TUNER_EVENT` (finished, failed, stopped, interrupted) and `TUNER_STUDY`. CMD runs in its own
process group under a deadline (`timeout_s`), killed as a group past it; whatever goes wrong
with it is one line on stderr and never changes the study's outcome or exit code. Its stdout
is discarded (the tuner's own stdout is the exported config). A webhook, the URL kept in the
environment rather than in the study file:

    tuner tune study.yaml --notify 'curl -fsS -m 10 -H "Content-Type: application/json" \\
        --data-binary @- "$WEBHOOK_URL"'
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

from tuner.config.schema import DEFAULT_TIMEOUT_S, NotifySection


def notify_for(command: str | None, section: NotifySection | None) -> NotifySection | None:
    """The notification to send: `--notify CMD` wins over the file's command (keeping the
    file's deadline); None when neither asks for one."""
    if command:
        timeout = section.timeout_s if section else DEFAULT_TIMEOUT_S
        return NotifySection(command=command, timeout_s=timeout)
    return section


def send(notify: NotifySection, summary: Mapping[str, Any]) -> str | None:
    """Run the command with `summary` as JSON on stdin; None when it succeeded, else why not."""
    payload = (json.dumps(summary, indent=2, default=str) + "\n").encode()
    env = {
        **os.environ,
        "TUNER_EVENT": str(summary.get("event", "")),
        "TUNER_STUDY": str(summary.get("study", "")),
    }
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", notify.command],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # past the deadline the whole group goes, curl and all
        )
    except OSError as exc:
        return f"cannot run it: {exc}"
    try:
        _, err = proc.communicate(payload, timeout=notify.timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return f"it ran past its {notify.timeout_s:g} s deadline and was killed"
    except KeyboardInterrupt:  # a second Ctrl-C: the command goes too
        _kill(proc)
        raise
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()
        return f"it exited with status {proc.returncode}" + (f": {said[-1][:200]}" if said else "")
    return None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command's process group (started by us, in its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
