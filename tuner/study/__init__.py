"""The optuna study of one `tuner tune` run: storage, locks, the loop, callbacks, confirmation.

`loop` (`Tuning`: ask, run a trial, tell; zombies, the baseline, duplicates), `states` (the one
place an outcome becomes an optuna state), `callbacks` (retries, the runaway halt, probes),
`confirm` (confirmation runs on fresh servers), `baseline` (trial 0), `reproduce` (when a world
failure is the configuration's), `storage` (create or resume, the fingerprint check), `rdb` (a
database storage that rides out outages), `storage_failure` (the line for a study the world
stopped writing), `worklock` (one live run per study and worker, the server marker).
"""
