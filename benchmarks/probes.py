"""Measurements that need a fresh process each (memory deltas, a cold import state), run by the scale suite.

``python -m benchmarks.probes PROBE ARGS...`` runs one and prints its result as one JSON line;
:func:`run_probe` starts it and parses that line. Everything is imported before a probe measures, so a
probe's memory delta is the data it built, not the code it loaded.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import REPO

__all__ = ["PROBES", "check", "main", "run_probe", "scan", "worker_pss"]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024


def _children() -> list[int]:
    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(p))
            except OSError:
                pass
    return sorted(out)


def scan(how: str, root: str, index_dir: str) -> dict[str, Any]:
    """Seconds and MB to list ``root``: ``torchvision`` ImageFolder, ``ours``, or the index (``first``/``reuse``)."""
    import torchvision

    from lightning_fastdata.loading.index.files import scan_image_folder
    from lightning_fastdata.loading.index.store import IndexStore

    before, start = _rss_mb(), time.perf_counter()
    kept: Any
    if how == "torchvision":
        kept = torchvision.datasets.ImageFolder(root)
    elif how == "ours":
        kept = scan_image_folder(root)
    else:
        kept, lookup = IndexStore(index_dir).folder(root)
        if lookup.reused != (how == "reuse"):
            raise RuntimeError(f"index lookup {lookup} for {how!r}")
    return {"s": time.perf_counter() - start, "mb": _rss_mb() - before, "files": len(kept)}


def check(mode: str, root: str, index_dir: str, cache_dir: str) -> dict[str, Any]:
    """Seconds to check a current cache of ``root`` with ``verify_source=mode`` (raises if it is stale)."""
    from lightning_fastdata.cache.build import build_tensor_cache
    from lightning_fastdata.loading.index.store import IndexStore

    index, lookup = IndexStore(index_dir).folder(root)
    start = time.perf_counter()
    build_tensor_cache(cache_dir, index, None, read_only=True, progress=False, verify_source=mode)  # type: ignore[arg-type]
    return {"s": time.perf_counter() - start, "files": len(index), "index_reused": lookup.reused}


def worker_pss(which: str, root: str, epochs: str, batches: str) -> dict[str, Any]:
    """PSS (MB) of each of 2 workers after each epoch of ``batches`` batches, and of the main process."""
    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.measure import baseline_loader

    loader: Any
    if which == "torchvision":
        loader = baseline_loader(root, 64, 64, 2)
    else:
        dm = ImageFolderDataModule(
            root,
            val_fraction=0.0,
            image_size=64,
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            entropy_index=False,  # the plain decode, the same in every run (no index taken up from a cache)
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
    per_epoch = []
    for epoch in range(int(epochs)):
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for _ in itertools.islice(iter(loader), int(batches)):
            pass
        per_epoch.append([_pss_mb(p) for p in _children()])
    return {"pss_mb": per_epoch, "main_pss_mb": _pss_mb(os.getpid())}


PROBES: dict[str, Callable[..., dict[str, Any]]] = {"scan": scan, "check": check, "worker_pss": worker_pss}


def run_probe(probe: str, *args: str, timeout: float = 1200) -> dict[str, Any]:
    """Run ``probe`` in a fresh interpreter; its JSON result.

    Raises:
        RuntimeError: With the probe's stderr, if it failed.
    """
    cmd = [sys.executable, "-m", "benchmarks.probes", probe, *args]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)  # the lab: a checkout's
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": path})
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.probes PROBE ARGS...``: print the probe's result as JSON."""
    probe, *args = sys.argv[1:] if argv is None else argv
    print(json.dumps(PROBES[probe](*args)))


if __name__ == "__main__":
    main()
