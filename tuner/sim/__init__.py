"""The simulated SGLang server: SGLang's flags, HTTP API, capacity math and failures, no GPU."""

from tuner.sglang.tables import BASE_VERSION

#: the SGLang version the simulator speaks: its parser is built from this version's flag table
#: (`tuner check` reads it as `sglang.__version__` is read for `-m sglang.launch_server`)
__version__ = BASE_VERSION
