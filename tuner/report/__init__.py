"""What a study tells people afterwards: the exported launch config and every view of the trials.

`export` (best.yaml in SGLang's `--config` format, a command line, JSON; atomic writes), `rows`
(`tuner status`'s table and JSON, the CSV), `page`, `figures` and `runs` (`tuner report`'s
offline HTML page and its charts), `summary` (the JSON a notify command receives).
"""
