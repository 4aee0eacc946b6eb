"""The folder module reading a bucket: local disk vs a local S3 server, direct and with 20 ms per request.

One interleaved run on the same JPEGs (uploaded to a SeaweedFS server on 127.0.0.1): the torchvision baseline
on the local folder, :class:`~lightning_fastdata.ImageFolderDataModule` on the local folder, on ``s3://`` direct,
on ``s3://`` through a proxy that adds ``--delay-ms`` before every request (a bucket in a remote region), and the
same with one request in flight per worker (no concurrency: what a loader that fetches file by file gets), and
what users write today for a bucket: a ``Dataset`` whose ``__getitem__`` calls boto3's ``get_object``, opens the
bytes with PIL and applies torchvision's classic transforms (direct and through the proxy; skipped, and said so,
without boto3: ``pip install lightning-fastdata[s3-bench]``). The decode ceiling (one core's read + full decode)
is measured in the same run.

Then the peer and the answer for data bigger than the local disk: LitData on the same bucket (its chunks, its
local cache; :mod:`~benchmarks.litdata_rows`; with the ``s3-bench`` extra), with a cache smaller
than the data (every epoch downloads everything again) and with one that holds it; and the compact JPEG cache
(``convert_folder_to_hdf5(src=url, max_side=256)``) built once from the bucket, timed (the build's images/s and
its bytes per image are in the JSON's ``compact_cache``), then read by ``HDF5DataModule`` from the local disk.

    python -m benchmarks.s3 --json benchmarks/results/s3-folder.json

On a small machine the server and the proxy run on the same cores as the loader's workers and take CPU from
them: the s3 rows are a lower bound of what a remote bucket gives. So each row also says where the machine's
CPU went while it ran (``/proc``: the server's process, the proxy's, the rest, i.e. the loader), and the images
per CPU-second the loader used (``img_s_per_loader_core``): equal across the direct and delayed rows means the
loader hides the requests' latency, and what the s3 rows lose is CPU (the rig's server and proxy, the client).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

import benchmarks.litdata_rows as litdata_rows
from benchmarks.fault_proxy import FaultProxy, fault_proxy
from benchmarks.s3_server import local_s3_server, upload_folder
from lightning_fastdata.convert.hdf5 import convert_folder_to_hdf5
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.datamodules.hdf5 import HDF5DataModule
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.measure import (
    Candidate,
    baseline_loader,
    count_images,
    count_normalised,
    decode_ceiling,
    print_table,
    rows_for,
)

__all__ = ["GetObjectDataset", "main"]


class GetObjectDataset:
    """The per-item bucket loader users write: one ``get_object`` per sample, PIL, torchvision transforms.

    A map-style dataset over ``(key, label)`` pairs; the boto3 client is made lazily in each worker process.
    """

    def __init__(self, bucket: str, items: list[tuple[str, int]], endpoint: str, creds: dict[str, str], size: int):
        from torchvision import transforms

        self.bucket, self.items, self.endpoint, self.creds = bucket, items, endpoint, creds
        self.client: Any = None
        self.transform = transforms.Compose(
            [
                transforms.RandomResizedCrop(size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            ]
        )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import io

        import boto3
        from PIL import Image

        if self.client is None:
            self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **self.creds)
        key, label = self.items[i]
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return self.transform(Image.open(io.BytesIO(body)).convert("RGB")), label


def _per_item_loader(s3: Any, root: Path, prefix: str, endpoint: str, args: argparse.Namespace) -> Any:
    import torch

    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    items = [(f"{prefix}/{c}/{f.name}", label) for label, c in enumerate(classes) for f in sorted((root / c).iterdir())]
    creds = {"aws_access_key_id": s3.access_key_id, "aws_secret_access_key": s3.secret_access_key}
    dataset = GetObjectDataset(s3.bucket, items, endpoint, creds, args.size)
    return torch.utils.data.DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (field 3 on: state, parent, ...); ``[]`` if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), 0 if it cannot be read."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if len(fields) > 12 else 0.0


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _timed(
    candidates: list[Candidate],
    repeats: int,
    min_seconds: float,
    server_pid: int,
    proxy: FaultProxy,
    optional: frozenset[str] = frozenset(),
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]], dict[str, str]]:
    """``measure``'s interleaved rounds, with what each candidate's timed passes cost (summed).

    As :func:`~lightning_fastdata.measure.time_loader` (whole passes after 2 warm-up batches, until
    ``min_seconds``), and over the same window: where the CPU went, the images consumed, and the requests that
    went through the proxy. Building the loader, starting its workers and the warm-up are outside the window
    (LitData's spawned workers take seconds to import torch; a warm cache's filling epoch is not a training epoch).
    A run of an ``optional`` candidate (a peer) that raises is reported and left out; the others go on.
    """
    failed: dict[str, str] = {}
    rates: dict[str, list[float]] = {name: [] for name, _, _ in candidates}
    keys = ("seconds", "busy", "server", "proxy")
    cpu = {name: dict.fromkeys((*keys, "images", "all_requests", "all_images"), 0.0) for name, _, _ in candidates}

    def probe() -> tuple[float, ...]:
        busy, srv, prx = _machine_busy_s(), _process_cpu_s(server_pid), _process_cpu_s(proxy.pid)
        return time.perf_counter(), busy, srv, prx

    for round_ in range(repeats):
        for name, make, consume in candidates:
            try:
                run = _one_run(make, consume, min_seconds, probe, proxy)
            except Exception as err:
                if name not in optional:
                    raise
                failed[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                print(f"bench s3: round {round_ + 1}, {name} failed ({failed[name]}); its other runs are kept")
                continue
            (before, after, n, all_n, requests) = run
            rates[name].append(n / (after[0] - before[0]))
            for key, b, a in zip(keys, before, after):
                cpu[name][key] += a - b
            cpu[name]["images"] += n
            cpu[name]["all_images"] += all_n
            cpu[name]["all_requests"] += requests
            busy = (after[1] - before[1]) / (after[0] - before[0])
            print(f"bench s3: round {round_ + 1}, {name}: {rates[name][-1]:.0f} img/s, {busy:.2f} cores busy")
    for name in [n for n, r in rates.items() if not r]:
        del rates[name]
    return rates, cpu, failed


def _one_run(make: Any, consume: Any, min_seconds: float, probe: Any, proxy: FaultProxy) -> tuple[Any, ...]:
    """One timed run: (probe before, probe after, images timed, images in all, proxy requests in all)."""
    requests_at_start, all_n = len(proxy.requests()), 0
    loader = make()
    it = iter(loader)
    for _ in range(2):
        all_n += consume(next(it))
    before, n = probe(), 0
    while True:
        for batch in it:
            n += consume(batch)
        if time.perf_counter() - before[0] >= min_seconds:
            break
        it = iter(loader)
    after = probe()
    del it, loader
    return before, after, n, all_n + n, len(proxy.requests()) - requests_at_start


def _pin_process(pid: int, cpu: int) -> None:
    """Move every thread of ``pid`` and of its child processes to ``cpu`` (threads made later inherit it)."""
    pids = [pid] + [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent_of(int(p)) == pid]
    for proc in pids:
        for tid in os.listdir(f"/proc/{proc}/task"):
            try:
                os.sched_setaffinity(int(tid), {cpu})
            except OSError:  # the thread ended meanwhile
                pass


def _parent_of(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else -1


def _cpu_columns(c: dict[str, float]) -> dict[str, float]:
    busy = max(c["busy"], 1e-9)
    loader_cpu_s = max(c["busy"] - c["server"] - c["proxy"], 1e-9)
    return {
        "cpu_busy_cores": c["busy"] / max(c["seconds"], 1e-9),
        "cpu_share_server": c["server"] / busy,
        "cpu_share_proxy": c["proxy"] / busy,
        # totals over the row's timed passes, not the median rate: a stalled run counts
        "img_s_per_loader_core": c["images"] / loader_cpu_s,
        # through the latency proxy only (the direct rows bypass it): GET requests per image consumed, over whole
        # runs (a loader's first batches are fetched before the timed window)
        "requests_per_image": c["all_requests"] / max(c["all_images"], 1.0),
    }


def _module(root: str, args: argparse.Namespace, storage_options: dict[str, Any] | None) -> ImageFolderDataModule:
    dm = ImageFolderDataModule(
        root,
        storage_options=storage_options,
        val_fraction=0.0,
        image_size=args.size,
        batch_size=args.batch_size,
        num_workers=args.workers,
        entropy_index=False,  # the bucket's reads as they are, the same in every run
    )
    dm.setup("fit")
    return dm


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build the data, start the server and the proxy, time every row; print the table, write ``--json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1024, help="JPEGs to generate (8 classes)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=3.0)
    p.add_argument("--litdata-chunk", default="8MB", help="LitData's chunk_bytes")
    p.add_argument(
        "--pin",
        action="store_true",
        help="the loader (this process and its workers) on CPU 0, the S3 server and the proxy on CPU 1: a server "
        "that does not share the loader's cores",
    )
    p.add_argument("--json", default=None)
    p.add_argument(
        "--watchdog",
        type=float,
        default=None,
        help="after this many seconds, write every thread's stack to stderr (where a run that hangs waits)",
    )
    args = p.parse_args(argv)
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, exit=False)
    # a SIGTERM (a job scheduler, `kill`) ends this process through its `finally` blocks, which stop the S3 server
    # (started in its own session, it would otherwise outlive this process)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            raise SystemExit("bench s3: --pin needs 2 CPUs (the loader on one, the server and the proxy on the other)")
        loader_cpu, server_cpu = sorted(os.sched_getaffinity(0))[:2]
        os.sched_setaffinity(0, {loader_cpu})  # the server and the proxy start from here: moved just after
        # what `taskset -c 0 python ...` gives: torch sizes its thread pool to the CPUs it may use at start-up, and
        # this process was started on 2 (two threads sharing one core made the CPU normalise 1.6x as costly)
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fastdata-s3-bench-") as tmp:
        root = make_image_folder(
            Path(tmp) / "train", num_classes=8, per_class=args.images // 8, size=(500, 375), processes=2
        )
        files = sorted(str(f) for f in root.rglob("*.jpg"))
        bytes_per_image = sum(os.path.getsize(f) for f in files) / len(files)
        with local_s3_server(Path(tmp) / "s3") as s3, fault_proxy(s3.endpoint, delay=args.delay_ms / 1000) as slow:
            url = s3.url("train")
            if args.pin:
                for pid in (s3.pid, slow.pid):
                    _pin_process(pid, server_cpu)
            upload_folder(root, url, s3.storage_options())
            local = _module(str(root), args, None)
            direct = _module(url, args, s3.storage_options())
            remote = _module(url, args, s3.storage_options(slow.endpoint))
            serial = _module(url, args, s3.storage_options(slow.endpoint, max_inflight=1))
            ms = f"{args.delay_ms:g} ms"
            candidates: list[Candidate] = [
                ("torchvision ImageFolder (local)", lambda: baseline_loader(str(root), args.size, args.batch_size,
                                                                             args.workers), count_images),
                ("ImageFolderDataModule (local)", local.train_dataloader, count_normalised(local)),
                ("ImageFolderDataModule (s3, direct)", direct.train_dataloader, count_normalised(direct)),
                (f"ImageFolderDataModule (s3, +{ms}/request)", remote.train_dataloader, count_normalised(remote)),
                (f"ImageFolderDataModule (s3, +{ms}, 1 in flight)", serial.train_dataloader, count_normalised(serial)),
            ]  # fmt: skip
            try:
                import boto3  # noqa: F401

                candidates += [
                    ("per-item get_object + PIL + torchvision (s3, direct)",
                     lambda: _per_item_loader(s3, root, "train", s3.endpoint, args), count_images),
                    (f"per-item get_object + PIL + torchvision (s3, +{ms}/request)",
                     lambda: _per_item_loader(s3, root, "train", slow.endpoint, args), count_images),
                ]  # fmt: skip
            except ImportError:
                print("bench s3: boto3 is not installed: the per-item get_object rows are skipped (the s3-bench extra)")
            if litdata_rows.available():
                lit_url = s3.url("litdata")
                lit_bytes = litdata_rows.optimize_to_bucket(
                    root, Path(tmp), lit_url, s3.storage_options(), args.litdata_chunk
                )
                # 60% of the data: evicted as it is read, so each epoch downloads it again (a third of it left
                # LitData 0.2.76 waiting 120 s for a chunk: its 2 workers x 2 chunks ahead did not fit)
                small = f"{max(1, lit_bytes * 3 // 5 // 2**20)}MB"

                def lit(endpoint: str, cache: str | None, warm: bool) -> Any:
                    return lambda: litdata_rows.litdata_loader(
                        lit_url, endpoint, s3, Path(tmp), args.batch_size, args.workers, args.size, cache, warm
                    )

                candidates += [
                    ("LitData (s3, direct, cache < data)", lit(s3.endpoint, small, False), count_images),
                    (f"LitData (s3, +{ms}/request, cache < data)", lit(slow.endpoint, small, False), count_images),
                    ("LitData (s3, cache holds the data, 2nd epoch on)", lit(s3.endpoint, None, True), count_images),
                ]
            else:
                print("bench s3: litdata is not installed: its rows are skipped (the s3-bench extra)")
            start = time.perf_counter()
            compact_path = convert_folder_to_hdf5(
                url, Path(tmp) / "compact.h5", max_side=256, storage_options=s3.storage_options(),
                processes=args.workers, progress=False,
            )  # fmt: skip
            compact = {
                "build_images_per_s": len(files) / (time.perf_counter() - start),
                "bytes_per_image": compact_path.stat().st_size / len(files),
                "max_side": 256,
            }
            compact_dm = HDF5DataModule(
                str(compact_path), val_fraction=0.0, image_size=args.size, batch_size=args.batch_size,
                num_workers=args.workers,
            )  # fmt: skip
            compact_dm.setup("fit")
            candidates.append(
                ("HDF5DataModule, compact cache built from s3 (local disk)", compact_dm.train_dataloader,
                 count_normalised(compact_dm))
            )  # fmt: skip
            ceiling = decode_ceiling(files[:256])
            peers = frozenset(name for name, _, _ in candidates if name.startswith("LitData"))
            rates, cpu, failed = _timed(candidates, args.repeats, args.min_seconds, s3.pid, slow, peers)
    best = max(ceiling.values())
    rows = rows_for(rates, args.workers, best)
    for row in rows:
        row.update(_cpu_columns(cpu[row["loader"]]))
    print_table(rows)
    print("| loader | busy cores | server share | proxy share | img/s per loader core | GETs per image (proxy) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['loader']} | {row['cpu_busy_cores']:.2f} | {row['cpu_share_server']:.0%} | "
            f"{row['cpu_share_proxy']:.0%} | {row['img_s_per_loader_core']:.0f} | {row['requests_per_image']:.2f} |"
        )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        # --pin: the loader on one CPU, the server and the proxy on another (rates are one loader core's)
        "pinned": args.pin,
        "images": len(files),
        "image_size": args.size,
        "batch_size": args.batch_size,
        "delay_ms": args.delay_ms,
        "decode_ceiling_per_core": ceiling,
        "bytes_per_image": bytes_per_image,  # what a streamed epoch fetches per image
        "compact_cache": compact,  # built once from the bucket, then read from the local disk every epoch
        "rows": rows,
        "failed": failed,  # peers' runs that raised (left out of their medians)
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
