"""A tiny SGLang-speaking aiohttp server (real HTTP on 127.0.0.1) for the load client's tests.

`FakeSGLang` speaks SGLang's streaming formats (sglang-reference.md section 4): native /generate
with cumulative text and completion_tokens, OpenAI deltas with a final usage chunk, [DONE],
/flush_cache, /metrics, /v1/models. It runs on its own event loop in a thread (`ServerThread`,
tests) or as a process (`python -m tests.helpers.fake_http [--token-delay S]` prints its port;
the benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import threading
from dataclasses import dataclass

from aiohttp import web


@dataclass
class FakeConfig:
    token_delay_s: float = 0.0  # sleep between tokens (0: stream as fast as possible)
    coalesce: int = 1  # tokens per SSE event
    fail_every: int = 0  # every k-th request answers 500
    hang_every: int = 0  # every k-th request never answers
    api_key: str | None = None
    first_token_delay_s: float = 0.0
    freeze_after: int = 0  # after this many requests the server stops answering (SIGSTOP-like)


class FakeSGLang:
    """A minimal SGLang-compatible server with its own counters."""

    def __init__(self, cfg: FakeConfig | None = None):
        self.cfg = cfg or FakeConfig()
        self.n_requests = 0
        self.gen_tokens = 0
        self.prompt_tokens = 0
        self.running = 0
        self.flushes = 0
        self.seen_auth: list[str | None] = []
        self._rendered: dict[tuple[int, int], list[bytes]] = {}  # native events, pre-encoded
        self.frozen = False

    async def _frozen(self) -> None:
        """A stopped process: accepted connections get nothing, streams stop mid-response."""
        if self.frozen:
            await asyncio.sleep(3600)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/completions", self.openai)
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        await self._frozen()
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def flush(self, request: web.Request) -> web.Response:
        await self._frozen()
        self.flushes += 1
        return web.Response(text="Cache flushed.")

    async def metrics(self, request: web.Request) -> web.Response:
        await self._frozen()
        lines = [
            "# TYPE sglang:generation_tokens_total counter",
            f'sglang:generation_tokens_total{{model_name="fake"}} {self.gen_tokens}',
            f'sglang:prompt_tokens_total{{model_name="fake"}} {self.prompt_tokens}',
            f'sglang:cached_tokens_total{{model_name="fake"}} {self.prompt_tokens // 2}',
            f'sglang:num_requests_total{{model_name="fake"}} {self.n_requests}',
            f'sglang:num_running_reqs{{model_name="fake"}} {self.running}',
            'sglang:num_queue_reqs{model_name="fake"} 0',
            f'sglang:token_usage{{model_name="fake"}} {min(1.0, self.running / 10)}',
            'sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="fake"} 3',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    async def _admit(self, request: web.Request) -> tuple[dict, web.Response | None]:
        auth = request.headers.get("Authorization")
        self.seen_auth.append(auth)
        if self.cfg.api_key and auth != f"Bearer {self.cfg.api_key}":
            return {}, web.json_response({"error": "Unauthorized"}, status=401)
        await self._frozen()
        body = await request.json()
        self.n_requests += 1
        k = self.n_requests
        if self.cfg.freeze_after and k > self.cfg.freeze_after:
            self.frozen = True
            await self._frozen()
        if self.cfg.fail_every and k % self.cfg.fail_every == 0:
            return body, web.json_response({"error": {"message": "boom"}}, status=500)
        if self.cfg.hang_every and k % self.cfg.hang_every == 0:
            await asyncio.sleep(3600)
        return body, None

    async def _stream(self, request: web.Request, events) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.running += 1
        try:
            if self.cfg.first_token_delay_s:
                await asyncio.sleep(self.cfg.first_token_delay_s)
            for ev in events:
                await self._frozen()
                if not isinstance(ev, bytes):
                    ev = b"data: " + json.dumps(ev).encode() + b"\n\n"
                await resp.write(ev)
                if self.cfg.token_delay_s:
                    await asyncio.sleep(self.cfg.token_delay_s * self.cfg.coalesce)
            await resp.write(b"data: [DONE]\n\n")
        finally:
            self.running -= 1
        return resp

    def _steps(self, n: int) -> list[int]:
        c = max(1, self.cfg.coalesce)
        return [min(i, n) for i in range(c, n + c, c)]

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body, err = await self._admit(request)
        if err is not None:
            return err
        n_in = len(body["input_ids"]) if "input_ids" in body else len(body["text"].split())
        n = int(body["sampling_params"]["max_new_tokens"])
        self.prompt_tokens += n_in
        self.gen_tokens += n

        def meta(i: int) -> dict:
            fin = {"type": "length", "length": n} if i == n else None
            return {
                "id": "r",
                "finish_reason": fin,
                "prompt_tokens": n_in,
                "completion_tokens": i,
                "cached_tokens": n_in // 2,
            }

        if not body.get("stream"):
            return web.json_response({"text": " t" * n, "meta_info": meta(n)})
        # pre-encoded once per shape so the benchmark measures the client, not this server
        events = self._rendered.get((n_in, n))
        if events is None:
            events = [
                b"data: "
                + json.dumps({"text": " t" * i, "output_ids": [], "meta_info": meta(i)}).encode()
                + b"\n\n"
                for i in self._steps(n)
            ]
            self._rendered[(n_in, n)] = events
        return await self._stream(request, events)

    async def openai(self, request: web.Request) -> web.StreamResponse:
        body, err = await self._admit(request)
        if err is not None:
            return err
        chat = "messages" in body
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n_in, n = len(prompt.split()), int(body["max_tokens"])
        self.prompt_tokens += n_in
        self.gen_tokens += n
        usage = {"prompt_tokens": n_in, "completion_tokens": n, "total_tokens": n_in + n}

        def chunk(i: int) -> dict:
            text = " t"  # OpenAI streams one delta per token here
            choice = {"index": 0, "finish_reason": "length" if i == n else None}
            choice.update({"delta": {"content": text}} if chat else {"text": text})
            return {"object": "chunk", "choices": [choice], "usage": None}

        if not body.get("stream"):
            return web.json_response({"choices": [{"text": " t" * n}], "usage": usage})

        def events():
            for i in range(1, n + 1):
                yield chunk(i)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield {"choices": [], "usage": usage}

        return await self._stream(request, events())


class ServerThread:
    """Runs a FakeSGLang on a free port of 127.0.0.1 in a background thread."""

    def __init__(self, fake: FakeSGLang):
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.runner = web.AppRunner(fake.app(), handle_signals=False, shutdown_timeout=0.2)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.ready = threading.Event()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.SockSite(self.runner, self.sock).start())
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()  # the thread made it, so the thread closes it

    def __enter__(self) -> ServerThread:
        self.thread.start()
        assert self.ready.wait(timeout=30), "fake server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.sock.close()


def _main() -> None:
    """Serve a FakeSGLang in this process (for the benchmark); print the port, serve forever."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--token-delay", type=float, default=0.0)
    ap.add_argument("--coalesce", type=int, default=1)
    args = ap.parse_args()
    fake = FakeSGLang(FakeConfig(token_delay_s=args.token_delay, coalesce=args.coalesce))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)

    async def serve() -> None:
        runner = web.AppRunner(fake.app(), access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock, backlog=2048).start()
        while True:
            await asyncio.sleep(3600)

    asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(_main())
