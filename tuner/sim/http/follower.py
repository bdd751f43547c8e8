"""A non-zero rank of a simulated server across nodes (`--node-rank` >= 1, sim/nodes.py).

SGLang 0.5.6.post2 (entrypoints/engine.py:868-889): such a node runs only its schedulers; once
they are ready it starts `launch_dummy_health_check_server(host, port)` (utils/common.py:2400:
/health, /ping, /health_generate answer 200) in a daemon thread and joins the schedulers. The
thread's uvicorn logs its bind error and exits (a SystemExit the thread swallows): the node
goes on serving its ranks without the endpoint. It never logs "fired up", serves no API.
"""

from __future__ import annotations

import asyncio
import errno
import signal
from typing import Any

from aiohttp import web

from tuner.sim.startup import bind_error_line


async def _ok(_: web.Request) -> web.Response:
    return web.Response(status=200)


async def run_follower(srv: Any) -> int:
    """`srv`: the rank's `SimServer` (http/server.py, which does not import this module).
    Start-up (the rendezvous with rank 0, then this node's schedulers), the dummy health
    server, then run until SIGTERM, rank 0's shutdown (exit 0) or a lost rank 0 (137)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, srv.stop.set)
    world = srv.world
    assert world is not None
    code = await srv._play_script(loop.time())
    if srv.crash is not None:
        return srv._print_crash(srv.crash)
    if code is not None:
        await world.close()
        return code
    app = web.Application()
    for path in ("/health", "/ping", "/health_generate"):
        app.router.add_get(path, _ok)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, srv.ns.host, srv.ns.port).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            srv.log(bind_error_line(srv.ns.host, srv.ns.port), raw=True)
        await srv.stop.wait()
        if srv.crash is not None:
            return srv._print_crash(srv.crash)
        return 0
    finally:
        await runner.cleanup()
        await world.close()
