"""``fastdata bench --suites recipe``: a training recipe through torchvision's loader and through ours, one run.

The recipe is a LightningCLI config's data arguments (``--recipe CONFIG``; default: the shipped
``recipe_torchvision``, torchvision's classification reference recipe: RandomResizedCrop 176 + flip,
TrivialAugmentWide, RandomErasing 0.1, MixUp 0.2 or CutMix 1.0 per batch). Rows, interleaved, same folder:

- ``torchvision reference loader``: the recipe as torchvision's ``references/classification`` builds it:
  ``ImageFolder`` (PIL decode), v2 ``RandomResizedCrop(antialias)``, flip, the per-image policies (our device
  policies as their torchvision objects), ``PILToTensor``, ``ToDtype``, ``Normalize``, ``RandomErasing``, and the
  batch transforms (MixUp/CutMix) in the ``collate_fn``; plain ``DataLoader`` with persistent workers;
- ``ours, policy in workers``: ``ImageFolderDataModule`` with the recipe's device policies run per sample in the
  workers instead (their torchvision objects as ``train_transforms``), twice: its batches through the DataModule's
  ``on_after_batch_transfer`` on this CPU (normalise, erase, mix: the reference's output, what a CPU-only step
  pays), and the loader alone (what the workers sustain when a GPU does the rest);
- ``ours, policy on the device (loader only)``: the recipe as configured: the loader hands out uint8 crops and
  their keys; what the device then does is timed apart (ms per batch, here on this CPU with one thread; on a GPU by
  ``scripts/gpu-check.sh`` when one is lent);
- ``ours, policy in workers / on the device, entropy_index=True (loader only)``: the same with each crop
  entropy-decoded alone from the entropy index (built in the bench's scratch folder before timing; where the
  compiled decoder is): what the default ``entropy_index="auto"`` gives once its background build is done;
- ``ours, RandomResizedCrop + flip only``: no recipe (normalised on this CPU), for reference;
- the ceiling: one core's full JPEG decode (PIL), times the workers.

    fastdata bench --suites recipe --workers 2 --json benchmarks/results/recipe.json
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torchvision.transforms import v2

from lightning_fastdata.augment.pipeline import as_transform_list
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.loading.batch import move_to_device
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available
from lightning_fastdata.measure import Candidate, count_images, count_normalised, measure, rows_for
from lightning_fastdata.recipe import per_image, reference_loader

__all__ = ["recipe_suite"]


def ours(
    root: str, recipe: dict[str, Any], batch_size: int, workers: int, where: str, **extra: Any
) -> ImageFolderDataModule:
    """Our DataModule with the recipe: ``where`` the policies run (``"device"``, ``"workers"``, ``"none"``).

    ``extra``: more DataModule arguments (``index_dir`` and ``entropy_index``: its index is built before timing).
    """
    kw = dict(recipe)
    extra.setdefault("entropy_index", False)  # the plain decode unless the row asks for the index
    if where == "workers":  # the device policies run per sample in the workers, after the user's own
        device = as_transform_list(kw.pop("device_transforms", None), "device_transforms")
        mine = as_transform_list(kw.pop("train_transforms", None), "train_transforms")
        steps = mine + per_image(device)
        kw["train_transforms"] = v2.Compose(steps) if steps else None
    elif where == "none":
        kw = {"image_size": kw.get("image_size", 224)}
    dm = ImageFolderDataModule(
        root,
        batch_size=batch_size,
        num_workers=workers,
        val_fraction=0.0,
        persistent_workers=workers > 0,
        **kw,
        **extra,
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


def device_cost(
    dm: ImageFolderDataModule, batches: int = 6, device: torch.device | None = None, warmup: int = 0
) -> float:
    """Median milliseconds per batch of ``on_after_batch_transfer`` (policies, normalise, erase, mix).

    The loader's batches are moved to ``device`` first; on a GPU each is timed with CUDA events, on the CPU
    (``None``) with one thread. The first ``warmup`` batches are not counted.
    """
    device = device or torch.device("cpu")
    got = [move_to_device(b, device) for _, b in zip(range(batches + warmup), dm.train_dataloader())]
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        times = []
        for batch in got:
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dm.on_after_batch_transfer(batch, 0)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            else:
                began = time.perf_counter()
                dm.on_after_batch_transfer(batch, 0)
                times.append(time.perf_counter() - began)
    finally:
        torch.set_num_threads(threads)
    return 1000 * statistics.median(times[warmup:])


def recipe_suite(
    root: str,
    recipe: dict[str, Any],
    batch_size: int,
    workers: int,
    repeats: int,
    min_seconds: float,
    ceiling: float,
    log: Callable[[str], None] = print,
    entropy_index_dir: str | None = None,
) -> dict[str, Any]:
    """Time the rows (see the module docstring); return ``{"rows": [...], "device_ops_ms_per_batch_cpu": ...}``.

    With ``entropy_index_dir`` (where the compiled decoder is installed), two more rows: the workers and device
    recipes with ``entropy_index=True``, its index built there before timing.
    """
    b, w = batch_size, workers
    in_workers, on_device, plain = (ours(root, recipe, b, w, where) for where in ("workers", "device", "none"))
    indexing = entropy_index_dir is not None and entropy_index_available()
    candidates: list[Candidate] = [
        ("torchvision reference loader", lambda: reference_loader(root, recipe, b, w), count_images),
        (
            "ours, policy in workers (+ normalise, erase, mix on this CPU)",
            in_workers.train_dataloader,
            count_normalised(in_workers),
        ),
    ]
    for where, dm, policy in (
        ("workers", in_workers, "policy in workers"),
        ("device", on_device, "policy on the device"),
    ):
        candidates.append((f"ours, {policy} (loader only)", dm.train_dataloader, count_images))
        if indexing:  # the same with the entropy index, built in entropy_index_dir by the first of these
            indexed = ours(root, recipe, b, w, where, index_dir=entropy_index_dir, entropy_index=True)
            candidates.append(
                (f"ours, {policy}, entropy_index=True (loader only)", indexed.train_dataloader, count_images)
            )
    candidates.append(("ours, RandomResizedCrop + flip only", plain.train_dataloader, count_normalised(plain)))
    rows = rows_for(measure(candidates, repeats=repeats, min_seconds=min_seconds), w, ceiling)
    cost = device_cost(on_device)
    log(f"device ops per batch of {b} on this CPU (one thread): {cost:.1f} ms ({1000 * b / cost:.0f} images/s)")
    return {"rows": rows, "device_ops_ms_per_batch_cpu": cost}
