"""``fastdata doctor`` on image-caption tar shards (img2dataset's layout): what is there, what is broken, how fast.

img2dataset leaves a key without its image or without its caption where a download failed; the shards' index finds
them (:class:`~lightning_fastdata.loading.index.tar_pairs.PairedTarIndex`'s ``skipped``) and
:class:`~lightning_fastdata.ImageTextDataModule` skips them. The doctor counts them per shard, names the worst shards,
and times the module on the shards (one rank's share of the CPUs, its worker count) within the time budget. Read-only
on the data: the shards' indexes go to a temporary directory it removes.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PairsReport", "diagnose_pairs", "format_pairs", "holds_tar_shards", "write_pairs_config"]


def holds_tar_shards(path: str) -> bool:
    """Whether ``path`` is a local folder whose files are ``.tar`` shards (and no class sub-folders of images)."""
    from lightning_fastdata.sources.tar import has_tar_shards

    if not os.path.isdir(path) or not has_tar_shards(path):
        return False
    return not any(entry.is_dir() for entry in os.scandir(path))  # class folders: an image folder, not shards


@dataclass
class PairsReport:
    """What the doctor found in a folder of image-caption shards.

    Attributes:
        path: The folder.
        caption_field: Where the captions are (``None``: ``key.txt``; else this field of ``key.json``).
        shards: The ``.tar`` files.
        pairs: The keys with both an image and a caption.
        skipped: The keys without one of them (skipped in training).
        skipped_by_shard: The shards with skipped keys, most first, and their counts.
        workers: The loader workers timed (one rank's share).
        images_per_s: ``ImageTextDataModule``'s rate on the shards with those workers.
        seconds: The whole run's time.
    """

    path: str
    caption_field: str | None
    shards: int
    pairs: int
    skipped: int
    skipped_by_shard: list[tuple[str, int]] = field(default_factory=list)
    workers: int = 0
    images_per_s: float = 0.0
    seconds: float = 0.0


def diagnose_pairs(
    path: str,
    caption_field: str | None = None,
    devices: int = 1,
    batch_size: int = 64,
    image_size: int = 224,
    seconds: float = 20.0,
    scratch_dir: str | None = None,
) -> PairsReport:
    """Count the pairs and the broken keys of the shards in ``path``, and time the module on them.

    Raises:
        FileNotFoundError: If ``path`` holds no shard (named).
    """
    import time

    from lightning_fastdata.captions.datamodule import ImageTextDataModule
    from lightning_fastdata.diagnose.timing import Budget, rank_share
    from lightning_fastdata.loading.workers import CpuBudget, resolve_num_workers
    from lightning_fastdata.sources.tar import load_paired_shards

    start = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="fastdata-doctor-pairs-", dir=scratch_dir)
    try:
        payload = "txt?" if caption_field is None else "json?"
        shards = load_paired_shards(path, scratch, payload)
        broken = sorted(((os.path.basename(s.path), s.skipped) for s in shards if s.skipped), key=lambda x: -x[1])
        cpus = CpuBudget.detect()
        workers = resolve_num_workers("auto", devices, cpus)
        kw: dict[str, Any] = dict(caption_field=caption_field, batch_size=batch_size, image_size=image_size)

        def make(w: int) -> Any:
            dm = ImageTextDataModule(path, num_workers=w, index_dir=scratch, persistent_workers=w > 0, **kw)
            dm.setup("fit")
            return dm.train_dataloader()

        with rank_share(max(1, cpus.usable // devices)):
            rate = Budget(seconds).time(functools.partial(make, workers), 1)
        return PairsReport(
            path=os.path.abspath(path),
            caption_field=caption_field,
            shards=len(shards),
            pairs=sum(len(s) for s in shards),
            skipped=sum(s.skipped for s in shards),
            skipped_by_shard=broken,
            workers=workers,
            images_per_s=rate,
            seconds=time.perf_counter() - start,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def format_pairs(report: PairsReport, write_config: str | None = None) -> str:
    """The report as the doctor prints it."""
    where = "key.txt" if report.caption_field is None else f"key.json's {report.caption_field!r}"
    lines = [
        f"fastdata doctor: {report.path}: {report.shards} tar shard(s) of image-caption pairs (captions from {where})",
        f"  pairs: {report.pairs:,}",
        f"  skipped: {report.skipped:,} key(s) without their image or their caption (failed downloads; never paired "
        "with another's)",
    ]
    for name, count in report.skipped_by_shard[:5]:
        lines.append(f"    {name}: {count}")
    if len(report.skipped_by_shard) > 5:
        lines.append(f"    ... and {len(report.skipped_by_shard) - 5} more shard(s)")
    lines.append(
        f"  ImageTextDataModule: {report.images_per_s:,.0f} images/s with {report.workers} worker(s) on one rank's "
        f"CPUs (measured in {report.seconds:.0f} s)"
    )
    lines.append(
        f"  next: fastdata fit --config {write_config}" if write_config else
        "  next: fastdata fit --config captions --data.init_args.root " + report.path
    )  # fmt: skip
    return "\n".join(lines)


def write_pairs_config(report: PairsReport, dst: str, batch_size: int, image_size: int) -> None:
    """A LightningCLI config of the shipped ``captions`` recipe on these shards, the measured workers and sizes.

    A ``val`` folder of shards beside the shards is its validation split; the demo's zero-shot classes are left out.
    """
    import yaml

    from lightning_fastdata.loading.atomic import atomic_write_text
    from lightning_fastdata.shipped import CONFIG_DIR

    config = yaml.safe_load((CONFIG_DIR / "captions.yaml").read_text())
    args = config["data"]["init_args"]
    args.update(root=report.path, num_workers=report.workers, batch_size=batch_size, image_size=image_size)
    val = os.path.join(os.path.dirname(report.path), "val")
    if os.path.abspath(val) != report.path and holds_tar_shards(val):
        args["val_root"] = os.path.abspath(val)
    else:
        args.pop("val_root", None)
    config["model"].pop("zero_shot_classes", None)
    if report.caption_field is not None:
        args["caption_field"] = report.caption_field
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(dst), yaml.safe_dump(config, sort_keys=False))
