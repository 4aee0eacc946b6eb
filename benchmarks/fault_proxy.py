"""An HTTP proxy in front of a local S3 server that adds latency, answers ``503 SlowDown`` or stalls chosen objects.

As a remote or throttled bucket does (``tc netem`` needs root); traffic goes to 127.0.0.1 only. For tests and
benchmarks, with :func:`~benchmarks.s3_server.local_s3_server`::

    with local_s3_server(tmp_path) as s3, fault_proxy(s3.endpoint, delay=0.02) as slow:
        dm = ImageFolderDataModule(s3.url("train"), storage_options=s3.storage_options(slow.endpoint))
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from benchmarks.s3_server import free_ports, wait_for_port

__all__ = ["FaultProxy", "fault_proxy"]


def _proxy_main(
    listen: int,
    upstream: str,
    delay: float,
    slowdown: dict[str, int],
    stall: dict[str, float],
    log: str,
    stall_body: dict[str, float] | None = None,
) -> None:
    """Serve 127.0.0.1:listen, forwarding each request to ``upstream`` after ``delay`` seconds (see fault_proxy)."""
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import unquote, urlsplit

    target = urlsplit(upstream)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    local = threading.local()
    hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = unquote(urlsplit(self.path).path)
            with lock:
                counts[path] = n = counts.get(path, 0) + 1
            time.sleep(delay)
            status = None
            for pattern, times in slowdown.items():
                if pattern in path and n <= times:
                    status = 503
            for pattern, seconds in stall.items():
                if pattern in path and n == 1:
                    time.sleep(seconds)
            if status == 503:
                reply = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                self._record(path, 503)
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            else:
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection(
                        target.hostname or "127.0.0.1", target.port, timeout=60
                    )
                headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException):
                    local.conn = None
                    raise
                self._record(path, resp.status)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in hop:
                        self.send_header(k, v)
                # a HEAD answer has no body but the object's length
                length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                body_stall = next((t for k, t in (stall_body or {}).items() if k in path and n == 1), None)
                if self.command != "HEAD" and body_stall is not None:  # headers and half the body, then silence
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    time.sleep(body_stall)
                    self.close_connection = True
                elif self.command != "HEAD":
                    self.wfile.write(data)

        def _record(self, path: str, status: int) -> None:
            # before the answer is sent: a client that has its answer finds the request in the log
            with lock, open(log, "a") as fh:
                fh.write(f"{self.command} {path} {status} {self.headers.get('Range', '-').replace(' ', '')}\n")

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # socketserver's default backlog is 5: loader workers with 64 requests in flight each overflow it, and a
        # dropped connect waits out the client's connect timeout (a multi-second stall no remote bucket causes)
        request_queue_size = 1024

    parent = os.getppid()

    def orphaned() -> None:  # the process that started this proxy is gone (SIGKILLed): end too
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    Server(("127.0.0.1", listen), Handler).serve_forever()


@dataclass(frozen=True)
class FaultProxy:
    """A running :func:`fault_proxy`: its endpoint, the requests it saw, and its process id."""

    endpoint: str
    log: Path
    pid: int = 0

    def requests(self) -> list[tuple[str, str, int]]:
        """``(method, path, status)`` of every request answered so far (logged as its answer starts)."""
        return [(m, p, s) for m, p, s, _ in self.requests_with_ranges()]

    def requests_with_ranges(self) -> list[tuple[str, str, int, str]]:
        """``(method, path, status, Range header or "-")`` of every request answered so far."""
        if not self.log.exists():
            return []
        rows = [line.split(" ") for line in self.log.read_text().splitlines() if line]
        return [(m, p, int(s), r) for m, p, s, r in rows]


@contextmanager
def fault_proxy(
    endpoint: str,
    delay: float = 0.0,
    slowdown: Mapping[str, int] | None = None,
    stall: Mapping[str, float] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    stall_body: Mapping[str, float] | None = None,
) -> Iterator[FaultProxy]:
    """An HTTP proxy (another process) in front of ``endpoint``.

    Args:
        endpoint: The server's ``http://127.0.0.1:PORT``.
        delay: Seconds added before each request is forwarded (a remote region's round trip).
        slowdown: ``{key substring: n}``: the first ``n`` requests for matching objects get ``503 SlowDown``.
        stall: ``{key substring: seconds}``: the first request for matching objects waits that long.
        stall_body: ``{key substring: seconds}``: the first answer for matching objects sends its headers and half
            its body, then nothing for that long (a connection that dies mid-transfer).
        log_dir: Where the request log goes (default: a temporary folder, removed when the block ends).
    """
    import tempfile

    with ExitStack() as stack:
        if log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="fastdata-proxy-"))
        yield from _run_proxy(endpoint, delay, slowdown, stall, Path(log_dir), stall_body)


def _run_proxy(
    endpoint: str,
    delay: float,
    slowdown: Mapping[str, int] | None,
    stall: Mapping[str, float] | None,
    folder: Path,
    stall_body: Mapping[str, float] | None,
) -> Iterator[FaultProxy]:
    listen = free_ports(1)[0]
    log = folder / f"proxy-{listen}.log"
    proc = get_context("fork").Process(  # fork: no re-import of the caller's __main__
        target=_proxy_main,
        args=(listen, endpoint, delay, dict(slowdown or {}), dict(stall or {}), str(log), dict(stall_body or {})),
        daemon=True,
    )
    proc.start()
    wait_for_port(listen)
    try:
        yield FaultProxy(f"http://127.0.0.1:{listen}", log, proc.pid or 0)
    finally:
        proc.terminate()
        proc.join(5)
