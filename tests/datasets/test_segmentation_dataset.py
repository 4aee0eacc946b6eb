"""The segmentation dataset (issue 63, first part): a VOC-style folder through keyed windows, in loader workers; on
scenes whose classes are their colours, every batch's masks are its images' classes; bad input named."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_fastdata.augment.segmentation import IGNORE_INDEX
from lightning_fastdata.datasets.segmentation import SegmentationFolderDataset
from lightning_fastdata.demos_segmentation import SEGMENTATION_CLASSES, classes_of_colours, make_segmentation_folder
from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader

N = len(SEGMENTATION_CLASSES)


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_segmentation_folder(tmp_path_factory.mktemp("seg") / "voc", count=14, size=(200, 150), seed=3)


def agreement(images: torch.Tensor, masks: torch.Tensor, margin: int = 3) -> tuple[int, int]:
    """(interior pixels whose mask is their image's class, interior pixels) over a batch."""
    agree = total = 0
    for image, mask in zip(images.numpy(), masks.numpy()):
        h, w = mask.shape
        padded = np.pad(mask.astype(np.int32), margin, constant_values=-1)
        keep = mask != IGNORE_INDEX
        for dy in range(2 * margin + 1):
            for dx in range(2 * margin + 1):
                keep &= padded[dy : dy + h, dx : dx + w] == mask
        agree += int((classes_of_colours(image)[keep] == mask[keep]).sum())
        total += int(keep.sum())
    return agree, total


@pytest.mark.timeout(120)
def test_training_batches_through_workers_hold_masks_that_follow_their_images(voc: Path) -> None:
    ds = SegmentationFolderDataset(voc, "train", num_classes=N, base_size=96, crop_size=64, seed=1)
    assert len(ds) == 11
    sampler = EpochSampler(len(ds), shuffle=True, seed=1)
    loader = PrefetchingDataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate_prebatched)
    agree = total = seen = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for images, masks in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 64, 64)
            assert masks.dtype == torch.uint8 and masks.shape == (images.shape[0], 64, 64)
            a, t = agreement(images, masks)
            agree, total, seen = agree + a, total + t, seen + len(images)
    assert seen == 22 and total > 10_000 and agree / total > 0.99
    # the same key, the same window on any worker: a sample rendered alone equals its batch's copy
    first = ds.__getitems__([(0, 3, 0), (0, 5, 0)])
    again = ds[(0, 5, 0)]
    assert torch.equal(first.images[1], again[0]) and torch.equal(first.labels[1], again[1])
    other = ds[(1, 5, 0)]  # another epoch: another window
    assert not torch.equal(other[1], again[1])


def test_evaluation_batches_are_at_the_base_size_padded_to_the_largest(voc: Path) -> None:
    ds = SegmentationFolderDataset(voc, "val", num_classes=N, train=False, base_size=90)
    images, masks = ds.__getitems__([0, 1, 2])
    sizes = []
    for k in range(3):
        with Image.open(ds.image_path(ds.ids[k])) as im:
            w, h = im.size
        s = 90 / min(w, h)
        sizes.append((round(h * s), round(w * s)))
    assert images.shape[2:] == (max(h for h, _ in sizes), max(w for _, w in sizes))
    for k, (h, w) in enumerate(sizes):
        assert (masks[k, h:, :] == IGNORE_INDEX).all() and (masks[k, :, w:] == IGNORE_INDEX).all()
        assert (images[k, :, h:, :] == 0).all() and (images[k, :, :, w:] == 0).all()
    a, t = agreement(images, masks)
    assert a / t > 0.99
    assert {int(v) for v in masks.unique()} <= set(range(N)) | {IGNORE_INDEX}


def test_bad_masks_and_missing_files_are_named(voc: Path, tmp_path: Path) -> None:
    bad = tmp_path / "voc"
    shutil.copytree(voc, bad)
    ids = (bad / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
    Image.open(bad / "SegmentationClass" / f"{ids[0]}.png").convert("RGB").save(
        bad / "SegmentationClass" / f"{ids[0]}.png"
    )
    ds = SegmentationFolderDataset(bad, "train", num_classes=N)
    with pytest.raises(DataError, match=rf"{ids[0]}\.png is a RGB mask: its pixels are colours, not classes"):
        ds[0]
    small = Image.open(voc / "SegmentationClass" / f"{ids[1]}.png").resize((50, 40), Image.NEAREST)
    small.save(bad / "SegmentationClass" / f"{ids[1]}.png")
    with pytest.raises(DataError, match=rf"{ids[1]}\.png is 50x40, its image .* is \d+x\d+: a mask must be"):
        ds[1]
    two = SegmentationFolderDataset(voc, "train", num_classes=2)  # the scenes hold classes 1..5
    with pytest.raises(DataError, match=r"holds the value [2-5], above the 2 classes \(and not the ignore index"):
        for i in range(len(two)):
            two[i]
    (bad / "SegmentationClass" / f"{ids[2]}.png").unlink()
    with pytest.raises(FileNotFoundError, match=rf"names '{ids[2]}', whose mask .* does not exist"):
        SegmentationFolderDataset(bad, "train", num_classes=N)
