"""What the tuner knows about SGLang itself, as data and pure functions.

- `flags`: the launch flags of `python -m sglang.launch_server` (names, aliases, types, choices,
  defaults) per SGLang version, name resolution as SGLang's argparse does it (aliases, unique
  prefixes), and what replaced a flag a newer version dropped. The records are in `tables`.
- `defaults`: the defaults SGLang computes from the GPU's memory (`--mem-fraction-static`,
  `--chunked-prefill-size`, `--cuda-graph-max-bs`), and a whole launch's defaults for one GPU.
- `failures`: the classes of a failed start or a dead server, from its exit code and log tail.

Versions known: 0.5.6.post2 (the default) and 0.5.23, each with SGLang's complete table (300
and 559 option strings), generated from its server_args.py by `extract` into `data/`; `tables`
says how a release is added.

This package imports nothing from `tuner.sim` (the simulator imports it, never the reverse) and
no I/O library: it is knowledge, not a client.
"""
