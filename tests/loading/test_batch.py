"""The typed training batch: its pixels move to the device, its keys stay on the host (``loading/batch.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2

from lightning_fastdata import ImageFolderDataModule, TensorCacheDataModule
from lightning_fastdata.augment import TrivialAugmentWide
from lightning_fastdata.loading.batch import DeviceBatch, move_to_device
from lightning_fastdata.loading.transport.prefetch import DevicePrefetcher

META = torch.device("meta")  # stands in for a GPU: what is moved there, and what stays on the host


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_keyed_batch_crosses_the_workers_whole_and_its_keys_never_leave_the_host(
    image_folder: Path, workers: int
) -> None:
    """Through real worker processes (the pooled shared-memory transport), the batch arrives as a ``DeviceBatch``;
    the DataModule's move, which the prefetcher uses too, puts its images and labels on the device and leaves its
    keys on the host, so the augmentation draws from them without reading anything back."""
    dm = ImageFolderDataModule(
        str(image_folder), image_size=32, batch_size=8, num_workers=workers, val_fraction=0,
        device_transforms=TrivialAugmentWide(), batch_transforms=v2.MixUp(alpha=0.2),
    )  # fmt: skip
    dm.setup("fit")
    batches = [b for _, b in zip(range(3), dm.train_dataloader())]
    for batch in batches:
        assert type(batch) is DeviceBatch and batch.keys is not None and batch.boxes is None
        assert batch.keys.shape == (8, 3) and batch.images.dtype == torch.uint8
    indices = [int(k) for b in batches for k in b.keys[:, 1]]
    assert len(set(indices)) == 24 and all(int(e) == 0 for b in batches for e in b.keys[:, 0])  # (epoch 0, index)
    moved = dm.transfer_batch_to_device(batches[0], META, 0)
    assert type(moved) is DeviceBatch and moved.images.device == META and moved.labels.device == META
    assert moved.keys is batches[0].keys  # the very host tensor: nothing copied, nothing to read back
    assert DevicePrefetcher("cpu").move is move_to_device  # the prefetcher moves with the same function
    images, targets = dm.on_after_batch_transfer(moved, 0)
    assert images.device == META and images.shape == (8, 3, 32, 32) and targets.shape == (8, 3)


def test_move_to_device_moves_any_other_batch_whole() -> None:
    plain = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 1]), {"extra": torch.ones(2)})
    moved = move_to_device(plain, META)
    assert moved[0].device == META and moved[1].device == META and moved[2]["extra"].device == META
    crop = DeviceBatch(plain[0], plain[1], None, torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, dtype=torch.bool))
    moved_crop = move_to_device(crop, META)
    assert moved_crop.keys is None and moved_crop.boxes.device == META and moved_crop.flips.device == META


@pytest.mark.timeout(180)
def test_the_cache_crops_on_the_device_from_a_device_batch(image_folder: Path, tmp_path: Path) -> None:
    """``TensorCacheDataModule(augment_on="device")``: the squares travel with each sample's box and flip; with a
    policy the keys too, and they stay on the host."""
    for policy in (False, True):
        dm = TensorCacheDataModule(
            str(image_folder), str(tmp_path / "cache"), cache_size=40, image_size=24, batch_size=4, num_workers=1,
            val_fraction=0, augment_on="device", device_transforms=TrivialAugmentWide() if policy else None,
        )  # fmt: skip
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
        assert type(batch) is DeviceBatch and batch.boxes.shape == (4, 4) and batch.flips.shape == (4,)
        assert (batch.keys is not None) == policy
        moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
        images, labels = dm.on_after_batch_transfer(moved, 0)
        assert images.shape == (4, 3, 24, 24) and images.dtype == torch.float32
        assert labels.shape == (4,) and labels.device.type == "cpu"
