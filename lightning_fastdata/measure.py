"""The measuring core under ``fastdata bench`` and ``fastdata doctor`` (it imports neither of them).

Timed passes, interleaved repeats, tables, the ceilings.

Public so that every suite (``folder`` in :mod:`~lightning_fastdata.bench.loaders`, ``hdf5``, ``cache``,
``callback``) and your own scripts time loaders the same way: :func:`measure` runs each ``Candidate`` (name,
loader factory, batch counter) for whole passes of at least ``min_seconds`` after warm-up batches, interleaving
the candidates over ``repeats`` rounds so that machine drift hits all alike; :func:`rows_for` turns the rates
into table rows with the ratio to the first (baseline) candidate.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.loading.atomic import atomic_write_text

__all__ = [
    "Candidate",
    "baseline_loader",
    "ceiling_img_s",
    "compare_folder_loaders",
    "count_images",
    "count_normalised",
    "decode_ceiling",
    "measure",
    "measure_one_thread",
    "memcpy_ceiling",
    "ours_module",
    "print_table",
    "rows_for",
    "save_results",
    "steady_rate",
    "time_loader",
]


def time_loader(
    make: Callable[[], Iterable[Any]], consume: Callable[[Any], int], warmup: int = 2, min_seconds: float = 2.0
) -> float:
    """Images/s over whole passes until ``min_seconds`` have passed, after ``warmup`` batches.

    Worker start-up is not counted: the first ``warmup`` batches are not timed, and every loader (the
    baselines included) keeps its workers between passes.
    """
    loader = make()
    it = iter(loader)
    for _ in range(warmup):
        consume(next(it))
    n, start = 0, time.perf_counter()
    while True:
        for batch in it:
            n += consume(batch)
        if n == 0:
            raise ValueError(
                f"The dataset has too few batches to time after {warmup} warm-up batches; lower --batch-size."
            )
        if time.perf_counter() - start >= min_seconds:
            return n / (time.perf_counter() - start)
        it = iter(loader)


def steady_rate(
    make: Callable[[], Iterable[Any]], consume: Callable[[Any], int], skip: int, max_seconds: float = 8.0
) -> float:
    """Images/s of one pass's steady state: the batches after the first ``skip``, for at most ``max_seconds``.

    :func:`time_loader` times whole passes, so each pass's start (every worker producing its first batch, the
    queue filling) is counted; on a small dataset with many workers that start is most of the pass. Here the
    first ``skip`` batches (pass ``warm-up + workers x prefetch_factor``: what was queued before the clock
    could start) are consumed untimed, and the clock runs from then on, within the same pass, so the figure is
    the rate the workers sustain. The dataset needs more than ``skip`` batches.
    """
    it = iter(make())
    for _ in range(skip):
        consume(next(it))
    n, start = 0, time.perf_counter()
    for batch in it:
        n += consume(batch)
        if time.perf_counter() - start >= max_seconds:
            break
    if n == 0:
        raise ValueError(f"The dataset has no batches after the first {skip}; use a larger folder.")
    return n / (time.perf_counter() - start)


def count_images(batch: Any) -> int:
    """The images in a ``(images, labels)`` batch."""
    return len(batch[1])


def count_normalised(dm: FastDataModule) -> Callable[[Any], int]:
    """A batch counter that first normalises the batch to float on the CPU, as a CPU-only training step would."""

    def consume(batch: Any) -> int:
        dm.on_after_batch_transfer(batch, 0)
        return len(batch[1])

    return consume


def baseline_loader(root: str, size: int, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """The loader users write today."""
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = datasets.ImageFolder(root, transform=tf)
    # Persistent workers (not the default) so that worker start-up between passes is not counted against it.
    return torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )


def ours_module(
    root: str,
    size: int,
    batch_size: int,
    workers: int,
    exact_decode: bool = False,
    entropy_index_dir: str | None = None,
) -> ImageFolderDataModule:
    """Our DataModule with the same data, size, batch size and workers.

    With ``entropy_index_dir``: ``entropy_index=True``, its index built there (``prepare_data``) before timing.
    """
    dm = ImageFolderDataModule(
        root,
        val_fraction=0.0,
        image_size=size,
        batch_size=batch_size,
        num_workers=workers,
        exact_decode=exact_decode,
        index_dir=entropy_index_dir,
        entropy_index=entropy_index_dir is not None,
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


def machine() -> str:
    """The machine and versions a benchmark ran with, in one line (every results file carries it)."""
    import PIL

    from lightning_fastdata.loading.jpeg.decode import pillow_simd_installed, roi_decode_available

    return (
        f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {'pillow-simd' if pillow_simd_installed() else 'Pillow'} {PIL.__version__}, "
        f"ROI JPEG decoder {'on' if roi_decode_available() else 'off'}"
    )


def decode_ceiling(files: list[str]) -> dict[str, float]:
    """One core reading and fully decoding every file: PIL and torchvision's decoder.

    torchvision's ``decode_image`` sends a JPEG to ``decode_jpeg`` (the key the results keep) and decodes a folder's
    PNGs too (``decode_jpeg`` itself stopped at the first PNG with a traceback).
    """
    from torchvision.io import ImageReadMode, decode_image

    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def pil() -> None:
        for f in files:
            with open(f, "rb") as fh:
                Image.open(io.BytesIO(fh.read())).convert("RGB")

    def tv() -> None:
        for f in files:
            with open(f, "rb") as fh:
                decode_image(torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8), mode=ImageReadMode.RGB)

    out = {}
    for name, fn in (("PIL", pil), ("decode_jpeg", tv)):
        start = time.perf_counter()
        fn()
        out[name] = len(files) / (time.perf_counter() - start)
    torch.set_num_threads(threads)  # the caller's, not the machine's count
    return out


def save_results(
    path: str | None, args: argparse.Namespace, skip: tuple[str, ...] = ("json", "scratch"), **fields: Any
) -> dict[str, Any]:
    """A suite's results: the date, :func:`machine`, its settings (``args`` less ``skip``), then ``fields``.

    Written as JSON to ``path`` (its folder made; atomically, so a stopped run leaves the previous file whole), or
    not written where ``path`` is ``None``. Returns what it wrote.
    """
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in skip},
        **fields,
    }
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(out, indent=2))
    return out


def ceiling_img_s(files: list[str], repeats: int, workers: int) -> float:
    """The full-decode ceiling of ``workers`` cores, in images/s.

    The median over ``repeats`` runs of one core's faster decoder (PIL or ``decode_jpeg``, :func:`decode_ceiling`)
    over ``files``, times the workers (at least one).
    """
    return statistics.median(max(decode_ceiling(files).values()) for _ in range(repeats)) * max(1, workers)


#: ``(name, make_loader, count_images_in_batch)``: one row of a suite.
Candidate = tuple[str, Callable[[], Iterable[Any]], Callable[[Any], int]]


def measure(candidates: list[Candidate], repeats: int, min_seconds: float) -> dict[str, list[float]]:
    """Images/s of each candidate, ``repeats`` runs of at least ``min_seconds`` each, interleaved."""
    rates: dict[str, list[float]] = {name: [] for name, _, _ in candidates}
    for _ in range(repeats):
        for name, make, consume in candidates:
            rates[name].append(time_loader(make, consume, min_seconds=min_seconds))
    return rates


def measure_one_thread(candidates: list[Candidate], repeats: int, min_seconds: float) -> dict[str, list[float]]:
    """:func:`measure` with the main process on one intra-op thread (restored after).

    On a machine with as many CPUs as workers, torch's other threads spin between operations on the CPUs the workers
    decode on (``FastDataCallback`` caps them so while training on an accelerator).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure(candidates, repeats, min_seconds)
    finally:
        torch.set_num_threads(threads)


def rows_for(rates: dict[str, list[float]], workers: int, ceiling: float | None) -> list[dict[str, Any]]:
    """Table rows; the first candidate is the baseline of the ratio column."""
    base = statistics.median(next(iter(rates.values())))
    rows = []
    for name, runs in rates.items():
        rate = statistics.median(runs)
        row = {"loader": name, "num_workers": workers, "images_per_s": rate, "vs_baseline": rate / base, "runs": runs}
        if ceiling:
            row["pct_of_decode_ceiling"] = 100 * rate / (ceiling * max(1, workers))
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """Markdown table of ``rows`` (with a "% of ceiling" column when the rows have one)."""
    pct = next((k for k in ("pct_of_decode_ceiling", "pct_of_memcpy_ceiling") if k in rows[0]), None)
    title = {"pct_of_decode_ceiling": " % of decode ceiling |", "pct_of_memcpy_ceiling": " % of memcpy ceiling |"}
    print("| loader | num_workers | images/s | vs baseline |" + (title[pct] if pct else ""))
    print("|---|---:|---:|---:|" + ("---:|" if pct else ""))
    for r in rows:
        extra = f" {r[pct]:.1f}% |" if pct else ""
        print(f"| {r['loader']} | {r['num_workers']} | {r['images_per_s']:.0f} | {r['vs_baseline']:.2f}x |{extra}")


def compare_folder_loaders(
    root: str, size: int, batch_size: int, workers: int, min_seconds: float = 3.0
) -> dict[str, float]:
    """Images/s of the torchvision baseline and of :class:`ImageFolderDataModule` on ``root``, one run each.

    The quick comparison ``fastdata demo`` prints: the same loaders, timing and worker start-up rule as
    ``fastdata bench --suites folder``, one round (``bench`` takes the median of several). Our batches are
    normalised to float here, as the baseline's are (on a GPU that step runs there instead), so both loaders
    hand out what a model on this machine would train on.
    """
    dm = ours_module(root, size, batch_size, workers)
    candidates: list[Candidate] = [
        ("baseline", lambda: baseline_loader(root, size, batch_size, workers), count_images),
        ("ours", dm.train_dataloader, count_normalised(dm)),
    ]
    rates = measure(candidates, repeats=1, min_seconds=min_seconds)
    return {name: runs[0] for name, runs in rates.items()}


def memcpy_ceiling(images: np.ndarray, batch_size: int, size: int, repeats: int) -> float:
    """One core copying ``size x size x 3`` uint8 samples (a sorted random gather per batch) into a batch array."""
    n = len(images)
    out = np.empty((batch_size, size, size, 3), np.uint8)
    rates = []
    for _ in range(repeats):
        order = np.random.default_rng(0).permutation(n)
        start = time.perf_counter()
        for b in range(0, n - batch_size + 1, batch_size):
            rows = np.sort(order[b : b + batch_size])
            np.copyto(out, images[rows, :size, :size])
        rates.append((n // batch_size) * batch_size / (time.perf_counter() - start))
    return statistics.median(rates)
