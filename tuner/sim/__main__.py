"""`python -m tuner.sim` / `tuner sim`: placeholder until the simulator lands (issue 3)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print("tuner sim: error: the simulator is not built yet (issue 3)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
