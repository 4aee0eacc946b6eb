"""The doctor on a bucket (``fastdata doctor s3://bucket/train``): list it, fetch a sample, time the fetches.

The sample is downloaded into the scratch directory and every option is then built and timed from that copy,
as for a local folder; the written configs point at the bucket. Streaming from the bucket (the folder module on
the URL) is capped at the rate the node can fetch: one process's measured concurrent rate times the node's
loader workers, an estimate the report states. The bucket is only read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lightning_fastdata.diagnose.probe import (
    DataProbe,
    FolderSample,
    one_core_decode_ceiling,
    sample_stats,
    too_few_error,
)
from lightning_fastdata.loading.index.files import scan_image_folder
from lightning_fastdata.loading.storage.bucket_index import list_bucket_folder
from lightning_fastdata.loading.storage.object_store import ObjectStorage

__all__ = ["probe_bucket"]


def probe_bucket(
    url: str,
    storage_options: Mapping[str, Any] | None,
    image_size: int,
    sample: int,
    scratch: Path,
    fetchers: int,
) -> tuple[DataProbe, FolderSample]:
    """List ``url``, fetch and decode a sample (kept in ``scratch/download``), time the fetches.

    ``fetchers``: the node's loader processes that would stream it (workers per rank x ranks), for the node's
    estimated fetch rate (``read_mb_s_cold``; ``read_mb_s_warm`` is one process's measured rate).

    Raises:
        FileNotFoundError: If the URL holds no class prefix with images.
        OSError: If fewer than 4 sampled images decode, or the bucket cannot be read (named).
    """
    storage = ObjectStorage(url, storage_options)
    start = time.perf_counter()
    index = list_bucket_folder(storage)[0]
    scan_s = time.perf_counter() - start
    n = len(index)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(sample, n), replace=False))
    rels = [index.relpath(int(i)) for i in rows]
    start = time.perf_counter()
    blobs = list(storage.read_many(rels))
    fetch_s = time.perf_counter() - start
    start = time.perf_counter()
    one_by_one = rels[: min(8, len(rels))]
    for rel in one_by_one:
        list(storage.read_many([rel]))
    request_ms = 1000 * (time.perf_counter() - start) / len(one_by_one)
    named = [(storage.url(rel), None if isinstance(d, OSError) else d) for rel, d in zip(rels, blobs, strict=True)]
    stats, corrupt, unreadable = sample_stats(iter(named), image_size)
    bad = set(corrupt) | set(unreadable)
    download = scratch / "download"
    for k, (i, rel, (name, data)) in enumerate(zip(rows, rels, named, strict=True)):
        if data is not None and name not in bad:  # the copy the options are built from: only what decodes
            folder = download / index.classes[int(index.labels[i])]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{k:06d}{os.path.splitext(rel)[1]}").write_bytes(data)
    fetched = sum(len(d) for d in blobs if not isinstance(d, OSError))
    if len(named) - len(bad) < 4:
        raise too_few_error(url, len(named), corrupt, unreadable)
    local = scan_image_folder(str(download))
    paths = [local.path(i) for i in range(len(local))]
    ceiling = one_core_decode_ceiling(paths)
    one_process = fetched / fetch_s / 1e6
    probe = DataProbe(
        kind="bucket",
        files=n,
        classes=len(index.classes),
        sampled=len(rels),
        corrupt=corrupt,
        unreadable=unreadable,
        data_gb=stats["mean_kb"] * n / 1e6,
        read_mb_s_warm=one_process,
        read_mb_s_cold=one_process * max(1, fetchers),
        scan_s=scan_s,
        decode_ceiling_1core=ceiling,
        request_ms=request_ms,
        **stats,
    )
    return probe, FolderSample(local, np.arange(len(local), dtype=np.int64), paths)
