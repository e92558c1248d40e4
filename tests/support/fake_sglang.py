"""A fake SGLang HTTP server for scrape tests and end-to-end tests: /metrics, server info and bad modes.

    fake = FakeSGLang(metrics_body=b"sglang:token_usage 0.5\\n")
    fake.start()
    ... scrape fake.url ...
    fake.mode = "hang"
    fake.stop()

Modes (set `mode` at any time; it applies to every path):
  ok          /metrics serves metrics_body; info_path ("/server_info", "/get_server_info" or None) serves
              info_body; any other path is a 404. With chunked=True the bodies use chunked encoding.
  refuse      not a server behaviour: to get "connection refused", stop() the server and keep using its url
              (the port stays free for the rest of the test in practice; nothing listens on it).
  hang        accept and never answer, until release() or stop().
  http500     500 Internal Server Error with a short text body.
  html        200 with an HTML page (what a proxy or a wrong port gives).
  truncated   Content-Length says 1000 bytes more than sent, then the connection closes.
  huge        streams 50 MB of metric lines without Content-Length (huge_declares_length=True sends it).
  slow_drip   headers at once, then the body one byte every drip_seconds (0.5 s).
  slow_headers  even the status line arrives one byte every drip_seconds.
Every handler thread ends promptly on stop(): waits watch one event and stop() shuts open sockets, so
the thread-leak guard in conftest stays quiet.

Run as a program (standard library only, so any python3 runs it, e.g. inside the exporter's image) it is a
stand-in SGLang server for the container tests: it prints SGLang's startup log lines to stdout, serves a
captured SGLang `/metrics` body and a server-info JSON, and prints a fatal prefill OOM block with its traceback
each time `/fake/oom` is requested (a path no SGLang serves; the test's trigger). `/fake/flood` prints
`--flood-bytes` of SGLang's decode-batch lines at `--flood-rate` bytes per second, then one such OOM block (each
with its own token count); the request answers once all of it is written. With `--oom-on-term`, SIGTERM prints
one last OOM block (SGLang's own exit message stands in as a line that must not be lost) and exits 0:

    python3 fake_sglang.py --port 30000 --metrics v0.5.16-dp2.prom --info info.json --info-path /get_server_info
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HUGE_BYTES = 50 * 1000 * 1000
_HUGE_LINE = b'sglang:num_used_tokens{model_name="fake",tp_rank="0"} 12345.0\n'
_HTML = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1></body></html>\n"


class FakeSGLang:
    """A ThreadingHTTPServer on 127.0.0.1 (port 0) in a thread, with a mutable mode."""

    def __init__(
        self,
        metrics_body: bytes = b"# TYPE sglang:token_usage gauge\nsglang:token_usage 0.0\n",
        info_body: bytes = b'{"version": "0.0.0-fake"}',
        info_path: str | None = "/server_info",
        port: int = 0,
    ) -> None:
        self.metrics_body = metrics_body
        self.info_body = info_body
        self.info_path = info_path
        self.mode = "ok"
        self.chunked = False
        self.huge_declares_length = False
        self.drip_seconds = 0.5
        self.requests: list[str] = []  # paths in arrival order
        self.actions: dict[str, Callable[[], None]] = {}  # path -> called, then 200 "ok" (in mode ok)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._release = threading.Event()
        self._open: set[socket.socket] = set()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.fake = self
        self._thread: threading.Thread | None = None
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeSGLang:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-sglang")
        self._thread.start()
        return self

    def release(self) -> None:
        """Let hanging requests finish (they close without an answer)."""
        self._release.set()

    def stop(self) -> None:
        """Stop serving, end every handler thread and close the port (so a new connect is refused)."""
        self._stopping.set()
        self._release.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):  # already closed by the client
                    sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins the handler threads

    def __enter__(self) -> FakeSGLang:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._open.add if add else self._open.discard)(sock)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True  # server_close() joins handler threads
    fake: FakeSGLang

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that hang up mid-body are the point of several modes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        self.server.fake._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        fake = self.server.fake
        with fake._lock:
            fake.requests.append(self.path)
        mode = fake.mode
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client gave up: expected for hang, drip and huge
            getattr(self, f"_mode_{mode}", self._mode_unknown)(fake)

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; version=0.0.4", *, extra: int = 0) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body) + extra))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _mode_ok(self, fake: FakeSGLang) -> None:
        if self.path == "/metrics":
            body, ctype = fake.metrics_body, "text/plain; version=0.0.4; charset=utf-8"
        elif fake.info_path is not None and self.path == fake.info_path:
            body, ctype = fake.info_body, "application/json"
        elif self.path in fake.actions:
            fake.actions[self.path]()
            body, ctype = b"ok\n", "text/plain"
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")
            return
        if not fake.chunked:
            self._send(200, body, ctype)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(0, len(body), 1000):
            part = body[i : i + 1000]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")

    def _mode_hang(self, fake: FakeSGLang) -> None:
        fake._release.wait()

    def _mode_http500(self, fake: FakeSGLang) -> None:
        self._send(500, b"Internal Server Error")

    def _mode_html(self, fake: FakeSGLang) -> None:
        self._send(200, _HTML, "text/html; charset=utf-8")

    def _mode_truncated(self, fake: FakeSGLang) -> None:
        self._send(200, fake.metrics_body, extra=1000)

    def _mode_huge(self, fake: FakeSGLang) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Connection", "close")
        block = _HUGE_LINE * (65536 // len(_HUGE_LINE))
        count = HUGE_BYTES // len(block)
        if fake.huge_declares_length:
            self.send_header("Content-Length", str(count * len(block)))
        self.end_headers()
        for _ in range(count):
            if fake._stopping.is_set():
                return
            self.wfile.write(block)

    def _mode_slow_drip(self, fake: FakeSGLang) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(fake.metrics_body)))
        self.end_headers()
        self.wfile.flush()
        self._drip(fake, fake.metrics_body)

    def _mode_slow_headers(self, fake: FakeSGLang) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(fake.metrics_body)
        self._drip(fake, head + fake.metrics_body)

    def _drip(self, fake: FakeSGLang, data: bytes) -> None:
        for i in range(len(data)):
            if fake._stopping.wait(fake.drip_seconds):
                return
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()

    def _mode_unknown(self, fake: FakeSGLang) -> None:
        self._send(500, f"fake_sglang: unknown mode {fake.mode!r}".encode())


# ------------------------------------------------------------------------------------------- the stand-in server


def _stamp(rank: str = "TP0") -> str:
    """SGLang's log prefix: [date time rank]."""
    return time.strftime(f"[%Y-%m-%d %H:%M:%S {rank}]", time.gmtime())


def prefill_oom_block(tokens: int = 16384, available: int = 6100) -> str:
    """A fatal prefill OOM as SGLang logs it: the logged block, then the scheduler's traceback."""
    text = (
        "Prefill out of memory. Try to lower your batch size.\n"
        f"Try to allocate {tokens} tokens.\n"
        f"Available tokens: {available} (available_size={available - 120} + evictable_size=120)\n"
    )
    stamp = _stamp()
    return (
        f"{stamp} {text}\n"
        f"{stamp} Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2104, in get_new_batch_prefill\n'
        "    new_batch.prepare_for_extend()\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/schedule_batch.py", line 1311, in prepare_for_extend\n'
        "    out_cache_loc = alloc_for_extend(self)\n"
        f"RuntimeError: {text}\n\n"
    )


def main(argv: list[str] | None = None) -> None:
    """Serve until killed (SIGTERM ends the process; nothing to save)."""
    parser = argparse.ArgumentParser(description="A stand-in SGLang server for the container tests.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics", required=True, help="file with a captured SGLang /metrics body")
    parser.add_argument("--info", required=True, help="file with the server-info JSON")
    parser.add_argument("--info-path", default="/get_server_info")
    parser.add_argument("--flood-bytes", type=int, default=64 * 1024, help="log bytes one /fake/flood prints")
    parser.add_argument("--flood-rate", type=int, default=256 * 1024, help="bytes per second /fake/flood prints")
    parser.add_argument("--oom-on-term", action="store_true", help="SIGTERM prints an OOM block, then exits 0")
    args = parser.parse_args(argv)
    with open(args.metrics, "rb") as fh:
        metrics = fh.read()
    with open(args.info, "rb") as fh:
        info = fh.read()
    fake = FakeSGLang(metrics_body=metrics, info_body=info, info_path=args.info_path, port=args.port)

    def oom() -> None:
        sys.stdout.write(prefill_oom_block())
        sys.stdout.flush()

    tokens = [20000]

    def flood() -> None:
        line = (
            f"{_stamp()} Decode batch. #running-req: 61, #token: 58113, token usage: 0.95, "
            "gen throughput (token/s): 2817.43, #queue-req: 3\n"
        )
        written, started = 0, time.monotonic()
        while written < args.flood_bytes:
            sys.stdout.write(line * 16)
            sys.stdout.flush()
            written += 16 * len(line)
            ahead = written / args.flood_rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # paced, as a server logs
        tokens[0] += 1
        sys.stdout.write(prefill_oom_block(tokens=tokens[0]))
        sys.stdout.flush()

    def term(signum: int, frame: object) -> None:
        tokens[0] += 1
        sys.stdout.write(prefill_oom_block(tokens=tokens[0]))
        sys.stdout.write(f"{_stamp()} Received sigterm; shutting down.\n")
        sys.stdout.flush()
        os._exit(0)

    fake.actions["/fake/oom"] = oom
    fake.actions["/fake/flood"] = flood
    if args.oom_on_term:
        signal.signal(signal.SIGTERM, term)
    sys.stdout.write(f"{_stamp()} Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=21.33 GB\n")
    sys.stdout.write(
        f"{_stamp()} max_total_num_tokens=61440, chunked_prefill_size=16384, max_prefill_tokens=16384, "
        "max_running_requests=256, context_len=32768, available_gpu_mem=5.12 GB\n"
    )
    fake.start()
    sys.stdout.write(f"INFO:     Uvicorn running on http://127.0.0.1:{args.port} (Press CTRL+C to quit)\n")
    sys.stdout.write(f"{_stamp()} The server is fired up and ready to roll!\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
