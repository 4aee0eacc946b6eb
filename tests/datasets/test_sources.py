"""The windowed sources know no target: a target kind written outside the package reads every source unchanged.

The sources (a folder, tar shards, Parquet files, one HDF5 file) hand a target kind each sample's payload and move it
through the image's window by the kind's own ``follow``; nothing of the mask is in them. Here a second kind, the raw
values of each payload with no class table (what a regression target such as depth would be), reads the same files as
the mask target and must give, per source, the mask batches' values exactly: were a source to decode, table or pad
masks itself, the two would part.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np
import pytest
import torch

from lightning_fastdata.segmentation.convert import (
    write_segmentation_hdf5,
    write_segmentation_parquet,
    write_segmentation_shards,
)
from lightning_fastdata.segmentation.demos import make_segmentation_folder
from lightning_fastdata.segmentation.layouts import MaskLayout
from lightning_fastdata.segmentation.target import MaskTarget, read_mask
from lightning_fastdata.sources.folder import PairedFolderDataset
from lightning_fastdata.sources.hdf5 import PairedHDF5Dataset
from lightning_fastdata.sources.parquet import PairedParquetDataset, load_parquet_files
from lightning_fastdata.sources.tar import PairedTarDataset, load_paired_shards
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.window import Window, render_mask
from lightning_fastdata.sources.windowed import WindowedDataset, padded_batch


class RawValues(TargetKind):
    """Each payload's values as they are (no table, no classes): a dense per-pixel target of 256 levels."""

    what = "values"
    num_classes = 256

    def decode(self, payload: Any, name: str) -> np.ndarray:
        return read_mask(payload, name) if isinstance(payload, bytes) else np.asarray(payload).astype(np.uint8)

    def size_of(self, value: np.ndarray) -> tuple[int, int]:
        return int(value.shape[1]), int(value.shape[0])

    def follow(self, value: np.ndarray, window: Window) -> torch.Tensor:
        return render_mask(value, window, fill=0)

    def collate(self, samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, Any]:
        return padded_batch(samples, 0)

    def present(self, value: np.ndarray) -> np.ndarray:
        return (np.bincount(value.ravel(), minlength=256) > 0).astype(np.uint8)

    def mapped(self, class_map: np.ndarray | None) -> Self:
        return self

    def cache_key(self) -> bytes:
        return b"raw"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sources")
    make_segmentation_folder(tmp / "voc", count=12, size=(96, 72), seed=6, fixed_size=True)
    write_segmentation_shards(tmp / "voc", "train", tmp / "tar", shard_bytes=30_000, num_classes=21)
    write_segmentation_parquet(tmp / "voc", "train", tmp / "pq", shard_bytes=30_000, rows_per_group=3, num_classes=21)
    write_segmentation_hdf5(tmp / "voc", ["train"], tmp / "seg.h5", num_classes=21)
    return tmp


def source(kind: str, root: Path, target: TargetKind, **windows: Any) -> WindowedDataset:
    index = str(root / "index")
    if kind == "folder":
        return PairedFolderDataset(root / "voc", "train", target, MaskLayout(), **windows)
    if kind == "tar":
        return PairedTarDataset(load_paired_shards(str(root / "tar"), index, "seg.png"), target, **windows)
    if kind == "parquet":
        return PairedParquetDataset(load_parquet_files(str(root / "pq"), index), target, "annotation", 3, **windows)
    return PairedHDF5Dataset(root / "seg.h5", "train", target, **windows)


@pytest.mark.parametrize("kind", ["folder", "tar", "parquet", "hdf5"])
@pytest.mark.parametrize("train", [True, False])
def test_another_target_kind_reads_every_source_and_follows_the_same_windows(
    files: Path, kind: str, train: bool
) -> None:
    windows = dict(train=train, base_size=60, crop_size=40, seed=3)
    masks = source(kind, files, MaskTarget(21), **windows)
    raw = source(kind, files, RawValues(), **windows)
    keys = [(1, i, 0) for i in range(len(masks))]
    images, classes = masks.__getitems__(keys)
    raw_images, values = raw.__getitems__(keys)
    assert torch.equal(images, raw_images)  # the same windows, drawn from the keys
    assert len(np.unique(classes.numpy())) > 3  # several classes and the ignored borders: a real comparison
    padding = classes == 255
    # VOC's values are its classes (255 the borders): where the window read the mask, the two kinds agree; the
    # padding is each kind's own (255 for masks, 0 for raw values)
    assert torch.equal(values[~padding | (values != 0)], classes[~padding | (values != 0)])
    assert raw.target is not masks.target and raw.targets.shape == (len(raw),)  # counts only unless sampling asks
    assert raw.kept(None, presence=True).targets.shape == (len(raw), 256)


def test_every_shard_source_reads_a_folder_a_glob_and_a_brace_pattern_alike(files: Path) -> None:
    """The patterns ``ShardDataModule`` reads name the shards of the paired sources (segmentation's and detection's
    shard and Parquet layouts) too: one notation for every module."""
    from lightning_fastdata.sources.parquet import has_parquet_files
    from lightning_fastdata.sources.tar import has_tar_shards

    index = str(files / "index")
    for folder, suffix, load in (
        ("tar", ".tar", lambda spec: load_paired_shards(spec, index, "seg.png")),
        ("pq", ".parquet", lambda spec: load_parquet_files(spec, index)),
    ):
        paths = sorted(str(p) for p in (files / folder).glob(f"*{suffix}"))
        assert len(paths) >= 2
        stem, first = os.path.dirname(paths[0]), os.path.basename(paths[0])
        digits = re.search(r"\d+", first)
        assert digits is not None
        width = len(digits.group())
        braces = os.path.join(stem, first.replace(digits.group(), f"{{{1:0{width}d}..{len(paths) - 1:0{width}d}}}"))
        assert [x.path for x in load(str(files / folder))] == paths
        assert [x.path for x in load(braces)] == paths[1:]
        assert [x.path for x in load(os.path.join(stem, f"*{suffix}"))] == paths
        assert has_tar_shards(braces) == (suffix == ".tar") and has_parquet_files(braces) == (suffix == ".parquet")
        missing = first.replace(digits.group(), f"{{{998:0{width}d}..{999:0{width}d}}}")
        with pytest.raises(FileNotFoundError, match=r"998.* does not exist"):
            load(os.path.join(stem, missing))


def test_serialized_items_read_back_as_they_were_from_one_array() -> None:
    """The folder source's pairs and COCO's inline annotations are held pickled in one array (what forked workers
    read without copying: ``benchmarks/detection_memory.py``); each reads back equal, by index, slice or iteration."""
    import pickle

    from lightning_fastdata.sources.folder import Serialized

    items = ["train2017/a.jpg", {"boxes": np.arange(8, dtype=np.float32).reshape(2, 4), "categories": [1, 3]}, "", 7]
    held = Serialized(items)
    assert len(held) == 4 and held[0] == items[0] and held[-1] == 7 and held[2] == ""
    assert np.array_equal(held[1]["boxes"], items[1]["boxes"]) and held[1]["categories"] == [1, 3]
    assert held[2:] == ["", 7] and list(held)[0] == items[0]
    assert len(held.__dict__) == 2  # an array and its offsets, whatever the count
    again = pickle.loads(pickle.dumps(held))  # to a spawned worker
    assert [again[i] for i in (0, 2, 3)] == [items[0], "", 7]
    with pytest.raises(IndexError):
        held[4]
