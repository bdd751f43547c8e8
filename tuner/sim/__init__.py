"""The simulated SGLang server: SGLang's flags, HTTP API, capacity math and failures, no GPU.

`engine/` (SGLang's scheduler on a virtual clock; pure), `http/` (the server in real time, with
SGLang's HTTP API), `virtual/` (whole studies in virtual time), `flags` (the played version's
parser), `profile` (hardware and model scenarios), `startup` (start-up: defaults, memory,
failures, log lines), `bootstrap` (a started server's engine), `faults` (`--sim-fault`),
`loglines` (version-dependent log lines), `tokens` (the deterministic tokenizer). The product
never imports this package but through `tuner sim` and `tuner tune --virtual`.
"""

from tuner.sglang.tables import BASE_VERSION

#: the SGLang version the simulator speaks: its parser is built from this version's flag table
#: (`tuner check` reads it as `sglang.__version__` is read for `-m sglang.launch_server`)
__version__ = BASE_VERSION
