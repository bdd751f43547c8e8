"""What to try next: the space, the sampler, concurrency on a running server, the mfs cliff.

`space` (the study's space as optuna distributions, server vs client params, the fingerprint),
`sampler` (building and reseeding the sampler, the grid), `mode` (whether concurrency is
searched on the running server: inner, joint or fixed), `inner` (the inner search's steps,
pure), `curve` (the throughput curve pooled over servers), `edge` (the mfs edge probe).
"""
