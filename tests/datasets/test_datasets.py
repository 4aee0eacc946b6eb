from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_fastdata import EpochSampler, ImageFolderDataset
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.transport.collate import collate_prebatched


def loader(ds: ImageFolderDataset, workers: int, epoch: int = 0, context: str | None = None) -> DataLoader:
    sampler = EpochSampler(len(ds), shuffle=True, seed=3)
    sampler.set_epoch(epoch)
    return DataLoader(
        ds,
        batch_size=8,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_prebatched,
        multiprocessing_context=context,
    )


def test_getitems_returns_one_uint8_channels_last_batch(image_folder: Path) -> None:
    ds = ImageFolderDataset(str(image_folder), image_size=40)
    images, labels = ds.__getitems__([(0, 0), (0, 14), (0, 38)])
    assert images.shape == (3, 3, 40, 40) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.tolist() == [0, 1, 2] and labels.dtype == torch.int64
    single, label = ds[(0, 14)]
    assert torch.equal(single, images[1]) and label == 1


def test_augmentation_is_a_function_of_seed_epoch_index(image_folder: Path) -> None:
    ds = ImageFolderDataset(str(image_folder), image_size=32, seed=1)
    a, _ = ds.__getitems__([(0, i) for i in range(10)])
    b, _ = ds.__getitems__([(0, i) for i in range(10)])
    c, _ = ds.__getitems__([(1, i) for i in range(10)])
    other_seed, _ = ImageFolderDataset(str(image_folder), image_size=32, seed=2).__getitems__(
        [(0, i) for i in range(10)]
    )
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, other_seed)


def test_validation_is_deterministic_center_crop(image_folder: Path) -> None:
    ds = ImageFolderDataset(str(image_folder), train=False, image_size=32)
    assert torch.equal(ds.__getitems__([(0, 3)])[0], ds.__getitems__([(5, 3)])[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_do_not_depend_on_worker_count(image_folder: Path, workers: int) -> None:
    ds = ImageFolderDataset(str(image_folder), image_size=32)
    expected = [b for b in loader(ds, 0, epoch=1)]
    got = [b for b in loader(ds, workers, epoch=1)]
    assert len(got) == 5 and len(got[-1][1]) == 39 - 32
    for (xe, ye), (xg, yg) in zip(expected, got):
        assert torch.equal(xe, xg) and torch.equal(ye, yg)
    seen = torch.cat([y for _, y in got])
    assert sorted(seen.tolist()) == sorted(ds.targets.tolist())


@pytest.mark.timeout(120)
@pytest.mark.slow  # 8 s on the 2-core VM (a spawned worker imports torch): the full run keeps it
def test_dataset_pickles_small_and_works_under_spawn(image_folder: Path) -> None:
    ds = ImageFolderDataset(str(image_folder), image_size=32)
    assert len(pickle.dumps(ds)) < 20_000
    got = [b for b in loader(ds, 2, context="spawn")]
    expected = [b for b in loader(ds, 0)]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, expected))


def corrupt_folder(tmp_path: Path) -> tuple[Path, Path]:
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=5, size=(48, 40))
    bad = root / "class_001" / "img_000002.jpg"
    bad.write_bytes(bad.read_bytes()[:300])
    return root, bad


def test_corrupt_image_raises_by_default_naming_it(tmp_path: Path) -> None:
    root, bad = corrupt_folder(tmp_path)
    ds = ImageFolderDataset(str(root), image_size=16)
    with pytest.raises(OSError, match=str(bad)) as raised:
        ds.__getitems__([(0, i) for i in range(10)])
    assert "b'" not in str(raised.value)


def test_a_file_that_is_no_image_is_named_as_the_user_wrote_it(tmp_path: Path) -> None:
    root, bad = corrupt_folder(tmp_path)
    bad.write_bytes(b"<html>not an image</html>")
    ds = ImageFolderDataset(str(root), image_size=16)
    with pytest.raises(OSError, match=f"Cannot decode image '{bad}': cannot identify image file. ") as raised:
        ds.__getitems__([(0, i) for i in range(10)])
    assert "BytesIO" not in str(raised.value)  # was: "... cannot identify image file <_io.BytesIO object at 0x...>"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_policy_logs_each_file_and_counts_across_workers(
    tmp_path: Path, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    root, bad = corrupt_folder(tmp_path)
    ds = ImageFolderDataset(str(root), image_size=16, on_corrupt="skip")
    with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
        batches = list(loader(ds, workers))
    assert sum(len(y) for _, y in batches) == 9
    assert ds.skipped_count() == 1
    if workers == 0:  # worker processes log to their own stderr
        assert str(bad) in caplog.text
    ds.reset_skipped_count()
    assert ds.skipped_count() == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="on_corrupt"):
        ImageFolderDataset("x", on_corrupt="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="image_size"):
        ImageFolderDataset("x", image_size=0)
    with pytest.raises(ValueError, match="scale"):
        ImageFolderDataset("x", scale=(0.5, 0.2))


def test_epoch_sampler_shards_disjoint_and_reshuffles() -> None:
    a, b = EpochSampler(11, num_replicas=2, rank=0), EpochSampler(11, num_replicas=2, rank=1)
    ia, ib = [i for _, i in a], [i for _, i in b]
    assert len(ia) == len(ib) == 6 and set(ia) | set(ib) == set(range(11))
    assert len(set(ia) & set(ib)) == 1  # one padded repeat, as DistributedSampler does
    a.set_epoch(1)
    assert [i for _, i in a] != ia and all(e == 1 for e, _ in a)
    with pytest.raises(ValueError, match="rank"):
        EpochSampler(5, num_replicas=2, rank=2)
