"""A test-only stand-in for `python -m sglang.launch_server`: /health, /get_server_info, failures.

Speaks a few SGLang flags (unknown ones are an argparse error, exit 2) plus `--fake-*` knobs:
  --fake-startup S      seconds of "loading" (/health 503) before ready
  --fake-fail CLASS     print SGLang's failure lines for CLASS after start-up and exit like SGLang
  --fake-hang           never become ready
  --fake-die-after S    die S seconds after ready with a runtime OOM (exit 137)
  --fake-report-mfs X   report X as mem_fraction_static (an args mismatch)
  --fake-report-pid N   expose `pid: N` in /get_server_info (default: this process's pid)
  --fake-child          keep a child process in the group (like SGLang's schedulers)
  --fake-ignore-term    ignore SIGTERM (to test the KILL escalation)
  --fake-no-pid         report no pid in /get_server_info (as real SGLang does)
  --fake-foreign FILE   first start a copy in a session of its own (another tenant's server,
                        reporting no pid; its pid written to FILE), then start as usual: the
                        port is taken, so this one fails to bind while the copy answers
The argv it got is printed first, one JSON line, so tests can see every value arrived whole.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAILS = {
    "oom_cuda_graph": (
        137,
        [
            "KV Cache is allocated. #tokens: 450000, K size: 27.47 GB, V size: 27.47 GB",
            "Scheduler hit an exception: Traceback (most recent call last):",
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "Received sigquit from a child process. It usually means the child failed.",
        ],
    ),
    "not_enough_memory": (
        137,
        [
            "Scheduler hit an exception: Traceback (most recent call last):",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.1",
            "Received sigquit from a child process. It usually means the child failed.",
        ],
    ),
    "host_memory": (
        137,
        [
            "ValueError: Not enough host memory available. Requesting 900.00 GB but only have "
            "100.00 GB free. Please reduce the size of the hierarchical cache.",
            "Received sigquit from a child process. It usually means the child failed.",
        ],
    ),
    "port_in_use": (
        1,
        [
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): "
            "address already in use"
        ],
    ),
    "crashed": (137, ["Scheduler hit an exception: KeyError: 'lm_head.weight'"]),
}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="launch_server.py")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--mem-fraction-static", type=float, default=0.835)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--schedule-policy", default="fcfs")
    p.add_argument("--fake-startup", type=float, default=0.2)
    p.add_argument("--fake-fail", choices=sorted(FAILS))
    p.add_argument("--fake-hang", action="store_true")
    p.add_argument("--fake-die-after", type=float)
    p.add_argument("--fake-report-mfs", type=float)
    p.add_argument("--fake-report-pid", type=int)
    p.add_argument("--fake-child", action="store_true")
    p.add_argument("--fake-ignore-term", action="store_true")
    p.add_argument("--fake-no-pid", action="store_true")
    p.add_argument("--fake-foreign")
    return p.parse_args(argv)


def start_foreign(argv: list[str], pid_file: str, host: str, port: int) -> None:
    """Another tenant's server on our port, outside our process group; back once it listens."""
    i = argv.index("--fake-foreign")
    rest = [*argv[:i], *argv[i + 2 :], "--fake-no-pid"]
    other = subprocess.Popen(
        [sys.executable, __file__, *rest],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(pid_file, "w") as f:
        f.write(str(other.pid))
    import urllib.request

    for _ in range(400):  # until it answers /health 200, as a ready server does
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.05)
    time.sleep(1.0)  # alive while the other answers: the caller's readiness poll sees its 200


def main() -> int:
    print(json.dumps(sys.argv[1:]), flush=True)
    args = parse(sys.argv[1:])
    if args.fake_foreign:
        start_foreign(sys.argv[1:], args.fake_foreign, args.host, args.port)
    if args.fake_ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.fake_child:
        subprocess.Popen(["sleep", "300"])  # same process group: a stop must reach it too
    ready = threading.Event()
    tokens = int(2_000_000 * args.mem_fraction_static)
    info = {
        "model_path": args.model_path,
        "host": args.host,
        "port": args.port,
        "mem_fraction_static": args.fake_report_mfs or args.mem_fraction_static,
        "max_running_requests": args.max_running_requests,
        "chunked_prefill_size": args.chunked_prefill_size,
        "schedule_policy": args.schedule_policy,
        "status": "ready",
        "max_total_num_tokens": tokens,
        "version": "0.5.6.post2",
        **({} if args.fake_no_pid else {"pid": args.fake_report_pid or os.getpid()}),
        "internal_states": [{"max_running_requests": args.max_running_requests or tokens // 2}],
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                code, body = (200, b"") if ready.is_set() else (503, b"")
            elif self.path in ("/get_server_info", "/server_info"):
                code, body = 200, json.dumps(info).encode()
            else:
                code, body = 404, b"{}"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    try:
        httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as exc:
        print(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"('{args.host}', {args.port}): address already in use",
            flush=True,
        )
        return 1
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print("Load weight end. type=FakeForCausalLM, dtype=torch.bfloat16", flush=True)
    time.sleep(args.fake_startup)
    if args.fake_fail:
        code, lines = FAILS[args.fake_fail]
        for ln in lines:
            print(ln, flush=True)
        return code
    while args.fake_hang:
        time.sleep(1)
    print(f"KV Cache is allocated. #tokens: {tokens}", flush=True)
    print("The server is fired up and ready to roll!", flush=True)
    ready.set()
    if args.fake_die_after is not None:
        time.sleep(args.fake_die_after)
        print("RuntimeError: Prefill out of memory. Try to lower your batch size.", flush=True)
        print(
            "Received sigquit from a child process. It usually means the child failed.", flush=True
        )
        os._exit(137)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set()) if not args.fake_ignore_term else None
    while not stop.wait(0.1):
        pass
    print("SIGTERM received. Draining requests and shutting down...", flush=True)
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
