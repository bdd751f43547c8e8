"""One trial end to end: pre-check, (re)start or reuse, load, score, learn.

`runner` (`TrialRunner.run`: one trial -> a `TrialOutcome`), `inner` (one server's inner search
over concurrency), `learning` (what trials teach the pre-check, live and recalled), `rejected`
(a command line SGLang refused: the study file's or the configuration's), `watchdog` (the
SIGALRM backstop behind the runner's deadlines).
"""
