"""Judging what the trials measured: latency tails pooled over runs, odds of holding, the winner.

`tails` (each run's latency histogram, pooled p99s and the odds a configuration holds its
limits; pure), `trials` (queries: completed, feasible, measured before, confirmations),
`winner` (the ranking, the lead over the runner-up, what confirmation runs again). No writes.
"""
