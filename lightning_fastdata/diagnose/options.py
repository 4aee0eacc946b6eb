"""The options the doctor times: each built for the sample in a scratch folder, with its cost and its config.

Every option has a stable ``key`` (what code compares) and a display ``name`` (what the report prints), and a
number of ``steps`` before training: 0 uses the data as it is; 1 builds itself in the DataModule's
``prepare_data`` on the first run; 2 needs a command first (``fastdata convert``). The list is in that order,
simplest first.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_fastdata.convert.hdf5 import convert_folder_to_hdf5
from lightning_fastdata.datamodules.cache import TensorCacheDataModule
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.datamodules.hdf5 import HDF5DataModule
from lightning_fastdata.datasets.hdf5_file import HDF5Layout
from lightning_fastdata.diagnose.probe import DataProbe, FolderSample
from lightning_fastdata.loading.index.store import RACY_SECONDS
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.measure import baseline_loader, memcpy_ceiling
from lightning_fastdata.recipe import reference_loader

__all__ = ["BASELINE", "INDEX_DIR_FILES", "PreparedOption", "folder_options", "hdf5_options"]

#: The key of the torchvision baseline (timed for the ratio; never recommended).
BASELINE = "baseline"
#: From this many files on, the written config keeps the file list (``index_dir``) instead of listing every run.
INDEX_DIR_FILES = 100_000


@dataclass
class PreparedOption:
    """An option built for the sample, ready to time: its loader for a worker count, and what building it cost.

    Args:
        key: Stable identifier (``"folder"``, ``"cache-raw"``, ``"hdf5-jpeg"``...).
        name: What the report prints.
        steps: 0: the data as it is; 1: builds itself in ``prepare_data``; 2: a command to run first.
        make: ``make(num_workers)`` returns the train loader (keeping its DataModule alive).
        kb_per_image: Storage per image.
        build_s_per_image: Build time per image on the sample (0: nothing to build).
        config: The LightningCLI ``data`` section (empty for the baseline).
        prepare: The command to run once before training (``""`` if none).
    """

    key: str
    name: str
    steps: int
    make: Callable[[int], Any]
    kb_per_image: float
    build_s_per_image: float
    config: dict[str, Any]
    prepare: str = ""


class _Held:
    """A DataModule's train loader that keeps the DataModule alive while it is timed."""

    def __init__(self, dm: Any, prepare: bool = False) -> None:
        if prepare:
            dm.prepare_data()
        dm.setup("fit")
        self.dm, self.loader = dm, dm.train_dataloader()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def _held(cls: type, path: str, kwargs: dict[str, Any], num_workers: int) -> _Held:
    """``cls(path, num_workers=..., **kwargs)``'s train loader; a cache is built (or found current) first."""
    return _Held(cls(path, num_workers=num_workers, **kwargs), prepare=cls is TensorCacheDataModule)


def _sample_folder(sample: FolderSample, scratch: Path) -> Path:
    """A folder of symlinks to the sampled files in the scratch directory (never in the data).

    Only the sampled classes get a folder: 256 files of 1,000 classes make a folder of 256 images, not of 1,000.
    """
    root, index = scratch / "sample", sample.index
    for k, i in enumerate(sample.rows):
        folder = root / index.classes[int(index.labels[i])]
        folder.mkdir(parents=True, exist_ok=True)
        src = index.path(int(i))
        (folder / f"{k:06d}{os.path.splitext(src)[1]}").symlink_to(os.path.abspath(src))
    # finished and never changed again: dated back past RACY_SECONDS, so that a file list kept in index_dir (the
    # entropy-index option's) is trusted at once instead of scanned again with a warning about a racy folder
    past = time.time() - 10 * RACY_SECONDS
    for folder in [*root.iterdir(), root]:
        os.utime(folder, (past, past), follow_symlinks=False)
    return root


#: A recipe's DataModule arguments: ``(as objects, as written in its config)``; empty: RandomResizedCrop + flip.
Recipe = tuple[dict[str, Any], dict[str, Any]]
_NO_RECIPE: Recipe = ({}, {})


def _finish_configs(
    options: list[PreparedOption], files: int, image_size: int, batch_size: int, recipe: Recipe = _NO_RECIPE
) -> None:
    for option in options:
        if not option.config:
            continue
        init = option.config["init_args"]
        init.update(image_size=image_size, batch_size=batch_size, num_workers="auto", **recipe[1])
        listed = "root" in init and not option.config["class_path"].endswith("HDF5DataModule")  # a folder, a bucket
        if listed and (files >= INDEX_DIR_FILES or is_url(init["root"])):
            init["index_dir"] = "cache/index"  # every rank lists the folder (bucket) in setup(): once per node
            if option.key.startswith("cache-"):
                init["verify_source"] = "folders"  # O(folders) per run instead of a stat of every file


def folder_options(
    root: str,
    probe: DataProbe,
    sample: FolderSample,
    scratch: Path,
    processes: int,
    batch_size: int,
    image_size: int,
    recipe: Recipe = _NO_RECIPE,
) -> list[PreparedOption]:
    """Build every option of an image folder for the sample (sets ``probe.memcpy_ceiling_1core``); simplest first.

    With a ``recipe``, every option trains with it, and the baseline is torchvision's reference loader of it.
    """
    sample_root = str(_sample_folder(sample, scratch))
    good = len(sample.paths)
    batch = max(1, min(batch_size, good // 4))
    kw: dict[str, Any] = dict(image_size=image_size, batch_size=batch, val_fraction=0.0, **recipe[0])
    in_bucket = is_url(root)
    src = root if in_bucket else os.path.abspath(root)
    if recipe[0]:
        baseline = "torchvision reference loader of the recipe (baseline)"
        make = lambda w: reference_loader(sample_root, {**recipe[0], "image_size": image_size}, batch, w)  # noqa: E731
    else:
        baseline = "torchvision ImageFolder (baseline)"
        make = lambda w: baseline_loader(sample_root, image_size, batch, w)  # noqa: E731
    options = [
        PreparedOption(BASELINE, baseline, 0, make, probe.mean_kb, 0.0, {}),
        PreparedOption(
            "folder",
            "ImageFolderDataModule (streamed from the bucket)" if in_bucket else "ImageFolderDataModule",
            0,
            functools.partial(_held, ImageFolderDataModule, sample_root, kw),
            probe.mean_kb,
            0.0,
            {"class_path": "lightning_fastdata.ImageFolderDataModule", "init_args": {"root": src}},
        ),
    ]
    if entropy_index_available():
        options.append(_entropy_option(sample_root, src, kw, scratch, probe.mean_kb, good))
    options += _cache_options(root, sample_root, src, kw, scratch, processes, probe, good)
    options += _hdf5_options(root, sample_root, src, kw, scratch, processes, good)
    _finish_configs(options, probe.files, image_size, batch_size, recipe)
    return options


def _data_name(root: str) -> str:
    """The data folder's (or bucket prefix's) last name, for the files the options write."""
    return root.rstrip("/").rsplit("/", 1)[-1] if is_url(root) else os.path.basename(os.path.abspath(root))


def _cache_side(kw: dict[str, Any]) -> int:
    """The stored shorter side of the caches and HDF5 files: what a 224 crop of a 256 resize keeps."""
    return max(kw["image_size"], round(kw["image_size"] * 256 / 224))


def _entropy_option(
    sample_root: str, src: str, kw: dict[str, Any], scratch: Path, mean_kb: float, good: int
) -> PreparedOption:
    """The folder module with the entropy index, built on the sample (its time and size per image counted)."""
    index_dir = scratch / "entropy-index"
    entropy_kw = {**kw, "index_dir": str(index_dir), "entropy_index": True}
    start = time.perf_counter()
    ImageFolderDataModule(sample_root, num_workers=0, **entropy_kw).prepare_data()
    built = time.perf_counter() - start
    index_bytes = sum(f.stat().st_size for f in index_dir.glob("entropy-*/blob.bin"))
    return PreparedOption(
        "folder-entropy",
        "ImageFolderDataModule(entropy_index=True)",
        1,
        functools.partial(_held, ImageFolderDataModule, sample_root, entropy_kw),
        mean_kb + index_bytes / good / 1e3,
        built / good,
        {
            "class_path": "lightning_fastdata.ImageFolderDataModule",
            # a local disk of ours: never inside the data folder
            "init_args": {"root": src, "index_dir": "cache/index", "entropy_index": True},
        },
    )


def _cache_options(
    root: str,
    sample_root: str,
    src: str,
    kw: dict[str, Any],
    scratch: Path,
    processes: int,
    probe: DataProbe,
    good: int,
) -> list[PreparedOption]:
    """The tensor cache of the sample, JPEG and raw (the raw one's memcpy ceiling set on ``probe``)."""
    side, name, options = _cache_side(kw), _data_name(root), []
    for storage in ("jpeg", "raw"):
        cache_dir = scratch / f"cache-{storage}"
        args: dict[str, Any] = dict(cache_size=side, storage=storage, build_processes=processes)
        start = time.perf_counter()
        TensorCacheDataModule(sample_root, str(cache_dir), num_workers=0, **kw, **args).prepare_data()
        options.append(
            PreparedOption(
                f"cache-{storage}",
                f"TensorCacheDataModule(storage='{storage}')",
                1,
                functools.partial(
                    _held, TensorCacheDataModule, sample_root, {"cache_dir": str(cache_dir), **kw, **args}
                ),
                # per image: the images and labels, not the manifest (its folder record grows with the folders)
                sum(f.stat().st_size for f in cache_dir.iterdir() if f.name != "manifest.json") / good / 1e3,
                (time.perf_counter() - start) / good,
                {
                    "class_path": "lightning_fastdata.TensorCacheDataModule",
                    "init_args": {
                        "root": src,
                        # a local disk with room for it (see the report): never inside the data folder
                        "cache_dir": f"cache/{name}-{storage}{side}",
                        "cache_size": side,
                        **({"storage": "jpeg"} if storage == "jpeg" else {}),
                    },
                },
            )
        )
        if storage == "raw":
            images = np.load(cache_dir / "train_images.npy", mmap_mode="r")
            batch = kw["batch_size"]
            probe.memcpy_ceiling_1core = memcpy_ceiling(
                np.asarray(images), min(batch, len(images)), kw["image_size"], 1
            )
    return options


def _hdf5_options(
    root: str, sample_root: str, src: str, kw: dict[str, Any], scratch: Path, processes: int, good: int
) -> list[PreparedOption]:
    """The sample converted to HDF5: its original JPEG bytes, JPEGs of the cache's side, and raw pixels."""
    side, name, options = _cache_side(kw), _data_name(root), []
    hdf5s: list[tuple[str, str, str, dict[str, Any]]] = [
        ("hdf5-original", "HDF5DataModule (original JPEG bytes)", f"{name}.h5", {"mode": "encoded"}),
        (
            "hdf5-jpeg",
            f"HDF5DataModule (JPEG, shorter side {side})",
            f"{name}-{side}.h5",
            {"mode": "encoded", "max_side": side},
        ),
        ("hdf5-raw", f"HDF5DataModule (raw {side} px)", f"{name}-raw{side}.h5", {"mode": "raw", "size": side}),
    ]
    for key, label, file, args in hdf5s:
        h5 = scratch / file
        start = time.perf_counter()
        convert_folder_to_hdf5(sample_root, h5, processes=processes, progress=False, **args)
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in args.items())
        options.append(
            PreparedOption(
                key,
                label,
                2,
                functools.partial(_held, HDF5DataModule, str(h5), kw),
                h5.stat().st_size / good / 1e3,
                (time.perf_counter() - start) / good,
                {"class_path": "lightning_fastdata.HDF5DataModule", "init_args": {"root": f"cache/{file}"}},
                prepare=f"fastdata convert hdf5 --src {src} --dst cache/{file} {flags}",
            )
        )
    return options


def hdf5_options(
    path: str, layout: HDF5Layout, batch_size: int, image_size: int, recipe: Recipe = _NO_RECIPE
) -> list[PreparedOption]:
    """The one option of an HDF5 file: read it as it is (with the ``recipe``, if any)."""
    n = len(layout.labels)
    batch = min(batch_size, max(1, n // 4))
    option = PreparedOption(
        "hdf5",
        f"HDF5DataModule ({layout.kind})",
        0,
        functools.partial(_held, HDF5DataModule, path, {"image_size": image_size, "batch_size": batch, **recipe[0]}),
        os.path.getsize(path) / n / 1e3,
        0.0,
        {"class_path": "lightning_fastdata.HDF5DataModule", "init_args": {"root": os.path.abspath(path)}},
    )
    _finish_configs([option], n, image_size, batch_size, recipe)
    return [option]
