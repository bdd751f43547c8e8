"""The simulated SGLang server: SGLang's flags, HTTP API, capacity math and failures, no GPU.

`engine/` (SGLang's scheduler on a virtual clock, DP attention's groups in lockstep, speculative
decoding; pure), `http/` (the server in real time, with SGLang's HTTP API), `virtual/` (whole
studies in virtual time), `flags` (the played version's parser), `profile` (hardware and model
scenarios) and `levers` (its speculative draft and DP attention's costs), `serverargs` (SGLang's
defaults and post-init, `tuner.sglang.postinit`), `memplan` (one GPU's memory through start-up),
`startup` (the start-up script: log lines, failures), `bootstrap` (a started server's engine),
`faults` (`--sim-fault`), `loglines` (version-dependent log lines), `tokens` (the deterministic
tokenizer). The product never imports this package but through `tuner sim` and `tuner tune
--virtual`.
"""

from tuner.sglang.tables import BASE_VERSION

#: the SGLang version the simulator speaks: its parser is built from this version's flag table
#: (`tuner check` reads it as `sglang.__version__` is read for `-m sglang.launch_server`)
__version__ = BASE_VERSION
