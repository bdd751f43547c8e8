"""The KV-cache calculus and what certainly cannot start: pure arithmetic from SGLang's formulas.

`calculus` (bytes per token for MHA/GQA/MLA, the pool from mfs, HiCache per rank, admission),
`precheck` (a trial's flags judged before a restart, with what earlier trials taught), `analysis`
and `tables` (`tuner capacity`'s reading and its tables), `models` (a model's config.json by path
or shipped name, the one file this package reads, and `hardware_of`: the pre-check's facts).
"""
