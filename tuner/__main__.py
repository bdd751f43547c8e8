"""`python -m tuner` is the `tuner` console script."""

from tuner.cli import main

raise SystemExit(main())
