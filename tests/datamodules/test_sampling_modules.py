"""Sampling on the DataModules: a skewed folder balanced through workers, subsets on every module, a bucket."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.stats import CHI2_999, chi_square

from benchmarks.s3_server import LocalS3
from lightning_fastdata import (
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    TensorCacheDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.testing import cpu_trainer


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 / 8 / 2 images of three classes (a 1:20 imbalance)."""
    root = make_image_folder(tmp_path_factory.mktemp("skewed") / "train", num_classes=3, per_class=40, size=(24, 20))
    for name, keep in (("class_001", 8), ("class_002", 2)):
        for image in sorted((root / name).iterdir())[keep:]:
            image.unlink()
    return root


def epoch_labels(dm: Any) -> list[int]:
    dm.setup("fit")
    return [int(label) for _, labels in dm.train_dataloader() for label in labels.tolist()]


@pytest.mark.timeout(120)
def test_a_skewed_folder_balanced_through_workers(skewed: Path) -> None:
    kw: dict[str, Any] = dict(image_size=16, batch_size=10, num_workers=2, val_fraction=0)
    plain = Counter(epoch_labels(ImageFolderDataModule(str(skewed), **kw)))
    assert plain == {0: 40, 1: 8, 2: 2}  # the skew: what a user sees today
    dm = ImageFolderDataModule(str(skewed), sample_weights="balanced", epoch_size=600, **kw)
    labels = epoch_labels(dm)
    counts = Counter(labels)
    assert len(labels) == 600 and chi_square(counts, {c: 200.0 for c in range(3)}) < CHI2_999[2], counts
    # the same epoch again (a function of seed and epoch), another one next epoch
    assert epoch_labels(ImageFolderDataModule(str(skewed), sample_weights="balanced", epoch_size=600, **kw)) == labels
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    assert [int(x) for _, ls in loader for x in ls.tolist()] != labels


@pytest.mark.timeout(300)
def test_a_subset_of_classes_on_every_module_renumbers_training_and_evaluation(skewed: Path, tmp_path: Path) -> None:
    kw: dict[str, Any] = dict(image_size=16, batch_size=8, num_workers=2, classes=["class_002", "class_000"])
    h5 = convert_folder_to_hdf5(skewed, tmp_path / "s.h5", processes=1, progress=False)
    modules = [
        ImageFolderDataModule(str(skewed), val_fraction=0.25, **kw),
        HDF5DataModule(str(h5), val_fraction=0.25, **kw),
        TensorCacheDataModule(str(skewed), str(tmp_path / "cache"), cache_size=20, build_processes=1, **kw),
    ]
    for dm in modules:
        assert dm.classes == ("class_002", "class_000") and dm.num_classes == 2
        if isinstance(dm, TensorCacheDataModule):
            dm.prepare_data()
        dm.setup("fit")
        train = Counter(epoch_labels(dm))
        val = Counter(int(x) for _, ls in dm.val_dataloader() for x in ls.tolist())
        assert set(train) | set(val) == {0, 1}  # class_001 left out, the others renumbered
        assert train[0] + val[0] == 2 and train[1] + val[1] == 40, (type(dm).__name__, train, val)
    # a model sized by the module trains on it (num_classes 2)
    model = ImageClassifier(num_classes=modules[0].num_classes, class_names=list(modules[0].classes))
    cpu_trainer(max_epochs=1).fit(model, datamodule=modules[0])
    # max_per_class and fraction: a fixed, seeded part of the training set
    capped = Counter(epoch_labels(ImageFolderDataModule(str(skewed), max_per_class=5, image_size=16, val_fraction=0)))
    assert capped == {0: 5, 1: 5, 2: 2}
    part = epoch_labels(ImageFolderDataModule(str(skewed), fraction=0.5, image_size=16, val_fraction=0))
    assert len(part) == 25


@pytest.mark.timeout(300)
def test_a_bucket_with_weights_and_a_subset(s3: LocalS3, s3_image_folder: str) -> None:
    dm = ImageFolderDataModule(
        s3_image_folder, storage_options=s3.storage_options(), image_size=16, batch_size=8, num_workers=2,
        val_fraction=0, sample_weights={"class_001": 9.0}, epoch_size=200, classes=["class_001", "class_002"],
    )  # fmt: skip
    counts = Counter(epoch_labels(dm))
    assert set(counts) == {0, 1} and sum(counts.values()) == 200
    assert chi_square(counts, {0: 180.0, 1: 20.0}) < CHI2_999[1], counts  # 9:1


def test_sampling_arguments_are_checked_when_the_module_is_made(skewed: Path) -> None:
    """What needs no data is checked in ``__init__``; ``classes=`` against the data's names when they are first read."""
    unknown = ImageFolderDataModule(str(skewed), classes=["class_000", "zebra"])
    with pytest.raises(ValueError, match=r"classes names \['zebra'\]"):
        unknown.setup("fit")
    with pytest.raises(ValueError, match="epoch_size should be a positive int"):
        ImageFolderDataModule(str(skewed), epoch_size=-1)
    with pytest.raises(ValueError, match="sample_weights='rare'"):
        ImageFolderDataModule(str(skewed), sample_weights="rare")
    with pytest.raises(ValueError, match="block_shuffle"):
        dm = ImageFolderDataModule(str(skewed), sample_weights="balanced", block_shuffle=4, num_workers=0)
        dm.setup("fit")
        dm.train_dataloader()
