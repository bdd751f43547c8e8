"""Where things are, from any test's folder: the checkout's root and the suite's data files."""

from __future__ import annotations

from pathlib import Path

#: the checkout's root (tuner/, search_spaces/, tests/)
REPO = Path(__file__).resolve().parents[2]
#: the suite's data files (prompt lists, ShareGPT samples)
DATA = REPO / "tests" / "data"
#: the shared helpers, some of which also run as scripts (fake_sglang.py)
HELPERS = REPO / "tests" / "helpers"
