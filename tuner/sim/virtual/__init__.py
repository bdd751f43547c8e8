"""The simulated server in virtual time: whole studies without HTTP or waiting.

`trial` (one trial: start-up verdict and engine), `server` (`VirtualServer`: the lifecycle's
seam on a virtual clock), `load` (a load run on the engine, as loadgen runs it), `study` (the
seams `tuner tune --virtual` hands to `api.tune`).
"""
