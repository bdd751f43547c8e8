"""`tuner check STUDY.yaml`: everything that can be known before the night, one line each.

Each check is a small function returning a `CheckLine` (ok / warn / FAIL / skip, its name, what
it found and what to do); `plan.CHECKS` orders them and names what each depends on. The cheap
part (`plan.before_night`) runs in `tuner tune` before its first trial. `lines`,
`flagset`, `spacefacts` and `reading` do no I/O; the others probe the host.
"""
