"""The SGLang server on its host: launch, lifecycle, containers, the way to its port, its logs.

`target` (the study's host, endpoint and launch template), `launch` (flags -> argv, env and the
launch script; pure), `lifecycle` (stop, start, wait ready, verify, classify), `runtime` and
`container` (a process group or a docker/podman container), `endpoint` (direct or an SSH
tunnel), `probes` and `info` (`/health`, `/get_server_info`), `startlog` (start-up milestones),
`logs` (the logs left on the host), `hostfacts` (the user's setup and other tenants told apart
from the configuration), `records` (what a restart returns).
"""
