"""Segmentation from one HDF5 file (issue 63): decoded (H x W x 3, 3 x H x W) and encoded images, masks N x H x W x 1,
a group per split; through 2 loader workers every batch's masks are its images' classes; bad files named."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers.masks import agreement, mask_hdf5

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES, make_segmentation_hdf5
from lightning_fastdata.sources.hdf5 import hdf5_split_group

N = len(SEGMENTATION_CLASSES)
WINDOW = dict(num_classes=N, base_size=72, crop_size=56, seed=4)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("seg-h5")
    raw = make_segmentation_hdf5(tmp / "raw.h5", count=16, size=(120, 90), seed=1)
    encoded = make_segmentation_hdf5(tmp / "encoded.h5", count=16, size=(120, 90), seed=1, encoded=True)
    with h5py.File(raw) as f, h5py.File(tmp / "chw.h5", "w") as g:  # the same scenes, planar
        g["train/images"] = f["train/images"][:].transpose(0, 3, 1, 2)
        g["train/masks"] = f["train/masks"][:, :, :, 0]
    return {"raw": raw, "encoded": encoded, "chw": tmp / "chw.h5"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["raw", "encoded"])
def test_batches_through_workers_hold_masks_that_follow_their_images(files: dict[str, Path], kind: str) -> None:
    ds = mask_hdf5(files[kind], hdf5_split_group(str(files[kind]), "train"), **WINDOW)
    assert len(ds) == 12
    sampler = EpochSampler(len(ds), shuffle=True, seed=1)
    loader = PrefetchingDataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, collate_fn=collate_prebatched)
    agree = total = seen = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for images, masks in loader:
            assert images.shape[1:] == (3, 56, 56) and masks.shape[1:] == (56, 56) and masks.dtype == torch.uint8
            a, t = agreement(images, masks)
            agree, total, seen = agree + a, total + t, seen + len(images)
    assert seen == 24 and total > 10_000 and agree / total > 0.99
    val = mask_hdf5(files[kind], "val", train=False, **WINDOW)
    images, masks = val.__getitems__([0, 1, 2, 3])
    assert images.shape == (4, 3, 72, 96) and masks.shape == (4, 72, 96)  # 120 x 90 at base 72, no padding needed
    a, t = agreement(images, masks)
    assert a / t > 0.99


def test_planar_images_and_trailing_axis_free_masks_give_the_same_batches(files: dict[str, Path]) -> None:
    hwc = mask_hdf5(files["raw"], "train", **WINDOW)
    chw = mask_hdf5(files["chw"], "train", **WINDOW)
    keys = [(0, 3, 0), (1, 7, 0), (2, 11, 1)]
    a, b = hwc.__getitems__(keys), chw.__getitems__(keys)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)


def test_bad_files_are_named(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"has no group 'test' \(its groups: \['train', 'val'\]\)"):
        hdf5_split_group(str(files["raw"]), "test")
    with pytest.raises(FileNotFoundError, match="has no dataset 'train/labels': give images_key= and masks_key="):
        mask_hdf5(files["raw"], "train", masks_key="labels", **WINDOW)
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((3, 20, 30, 3), np.uint8)
        f["masks"] = np.zeros((2, 20, 30), np.uint8)
        f["floats/images"] = np.zeros((2, 20, 30, 3), np.float32)
        f["floats/masks"] = np.zeros((2, 20, 30), np.uint8)
        f["sizes/images"] = np.zeros((2, 20, 30, 3), np.uint8)
        f["sizes/masks"] = np.zeros((2, 20, 31), np.uint8)
        f["wide/images"] = np.zeros((2, 20, 30, 3), np.uint8)
        f["wide/masks"] = np.full((2, 20, 30), 300, np.int16)
    with pytest.raises(ValueError, match=r"holds 3 images \(images\) and 2 masks \(masks\)"):
        mask_hdf5(path, "", **WINDOW)
    with pytest.raises(ValueError, match=r"floats/images holds float32 pixels: give uint8 images"):
        mask_hdf5(path, "floats", **WINDOW)
    with pytest.raises(ValueError, match=r"the images \(sizes/images\) are 30x20, the masks \(sizes/masks\) 31x20"):
        mask_hdf5(path, "sizes", **WINDOW)
    with pytest.raises(DataError, match=r"wide/masks\[1\] holds the value 300, which is no class of the 6"):
        mask_hdf5(path, "wide", **WINDOW)[1]


def test_float_pixels_are_refused_for_prediction_as_for_training(tmp_path: Path) -> None:
    """An HDF5 file of float images (0-1): training refused it, while trainer.predict cast its pixels to 0 or 1 and
    predicted on black images; now both name the file and say what to give."""
    from lightning_fastdata.sources.predict import PredictDataset

    path = tmp_path / "float.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.random.default_rng(0).random((4, 24, 32, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"float\.h5:images holds float32 pixels: give uint8 images"):
        PredictDataset(str(path), base_size=16)
