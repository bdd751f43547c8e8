"""The server logs a study writes on its host: where tuner chose the place (no
`target.workdir`: the host's /tmp), removed once nothing reads them; in a workdir, kept.

A log is read while its server runs and right after it is gone (the runner copies it to
`runs/<study>/trials/<n>/server.log` after a failed start, a death or a hang), so a gone
server's files are removed at the next start or when the study closes its seams.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tuner.errors import InfraError
from tuner.hosts.base import EXIT_SUFFIX, PID_SUFFIX, Host

log = logging.getLogger(__name__)


class HostLogs:
    """The log paths of one lifecycle's servers on `host`; `keep`: never remove them."""

    def __init__(self, host: Host, keep: bool):
        self.host = host
        self.keep = keep
        self.last: str | None = None  # the newest gone server's log: still to be fetched
        self._spent: list[str] = []

    def gone(self, log_path: str, also: Sequence[str] = ()) -> None:
        """The server writing `log_path` ended: its log stays readable until `sweep`; `also`:
        more suffixes of its files (a run killed mid-start may have left its launch files)."""
        self.last = log_path or None  # "": a server adopted from an earlier run, no log known
        if log_path and not self.keep:
            suffixes = ("", PID_SUFFIX, EXIT_SUFFIX, *also)
            self._spent += [log_path + suffix for suffix in suffixes]

    def sweep(self) -> None:
        """Remove the gone servers' files (their logs were fetched when they ended)."""
        files, self._spent, self.last = self._spent, [], None
        remove(self.host, files)


def remove(host: Host, files: Sequence[str]) -> None:
    """`rm -f` on the host; a failure is only a warning (tuner's files, not the user's)."""
    for i in range(0, len(files), RM_BATCH):  # a long study's files: argv stays short
        batch = files[i : i + RM_BATCH]
        try:
            host.run(["rm", "-f", "--", *batch])
        except InfraError as exc:
            log.warning("%s: cannot remove %s: %s", host.name, ", ".join(batch), exc)


#: paths per `rm` (each ~80 bytes: well below any host's argument limit)
RM_BATCH = 300
