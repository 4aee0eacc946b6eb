"""MixedDataModule: a folder, an HDF5 file and a bucket drawn in proportions, one class space, validation apart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from helpers.stats import CHI2_999, chi_square

from benchmarks.s3_server import LocalS3
from lightning_fastdata import (
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    MixedDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.testing import cpu_trainer


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HDF5 file of 10 images of classes ``class_001`` (shared with the first source) and ``class_009`` (its own)."""
    base = tmp_path_factory.mktemp("second")
    root = make_image_folder(base / "b", num_classes=2, per_class=5, size=(32, 24), seed=3)
    (root / "class_000").rename(root / "class_009")
    return convert_folder_to_hdf5(root, base / "b.h5", processes=1, progress=False)


def source_shares(dm: MixedDataModule, epoch: int = 0) -> np.ndarray:
    loader = dm.train_dataloader()
    drawn = loader.sampler.drawn(epoch)
    return np.bincount(np.searchsorted(dm.train_dataset.offsets, drawn, side="right") - 1, minlength=3)


@pytest.mark.timeout(300)
def test_sources_are_drawn_in_their_weights_with_one_class_space_through_workers(
    image_folder: Path, second: Path, s3: LocalS3, s3_image_folder: str
) -> None:
    kw: dict[str, Any] = dict(image_size=16, val_fraction=0.2)
    bucket = ImageFolderDataModule(s3_image_folder, storage_options=s3.storage_options(), **kw)
    mix = MixedDataModule(
        [ImageFolderDataModule(str(image_folder), **kw), HDF5DataModule(str(second), **kw), bucket],
        weights=[1.0, 3.0, 1.0], epoch_size=1000, image_size=16, batch_size=20, num_workers=2,
    )  # fmt: skip
    # by name: class_001 is one class in all three sources, class_009 the HDF5 file's own
    assert mix.classes == ("class_000", "class_001", "class_002", "class_009") and mix.num_classes == 4
    mix.setup("fit")
    shares = source_shares(mix)
    assert shares.sum() == 1000
    expected = np.array([200.0, 600.0, 200.0])
    assert chi_square(shares, expected) < CHI2_999[2], shares
    # through the workers: the labels the batches carry are the draws' labels, in the mix's class list
    labels = Counter(int(x) for _, batch in mix.train_dataloader() for x in batch.tolist())
    drawn = mix.train_dataloader().sampler.drawn(0)
    assert labels == Counter(mix.train_dataset.targets[drawn].tolist())
    assert labels[3] > 0 and set(labels) == {0, 1, 2, 3}
    # per rank: two ranks share the epoch's draws, each with the same number of samples
    from lightning_fastdata.loading.sampler import EpochSampler

    draws = mix.train_dataloader().sampler.draws
    ranks = [list(EpochSampler(len(mix.train_dataset), 2, r, seed=0, draws=draws)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 500
    for keys in ranks:
        per_source = np.bincount(np.searchsorted(mix.train_dataset.offsets, [k[1] for k in keys], "right") - 1)
        assert chi_square(per_source, expected / 2) < CHI2_999[2], per_source


@pytest.mark.timeout(300)
def test_each_sources_validation_set_is_its_own_loader_and_logged_apart(image_folder: Path, second: Path) -> None:
    kw: dict[str, Any] = dict(image_size=16, val_fraction=0.3)
    mix = MixedDataModule([ImageFolderDataModule(str(image_folder), **kw), HDF5DataModule(str(second), **kw)],
                          image_size=16, batch_size=8, num_workers=2)  # fmt: skip
    mix.setup("fit")
    loaders = mix.val_dataloader()
    assert len(loaders) == 2
    seen = [Counter(int(x) for _, batch in loader for x in batch.tolist()) for loader in loaders]
    assert sum(seen[0].values()) == 12 and sum(seen[1].values()) == 3  # 30% of 39, of 10
    assert set(seen[1]) <= {1, 3}  # the HDF5 file's classes, in the mix's list
    model = ImageClassifier(num_classes=mix.num_classes, class_names=list(mix.classes))
    trainer = cpu_trainer(max_epochs=1)
    trainer.fit(model, datamodule=mix)
    metrics = trainer.callback_metrics
    assert {"val_acc/dataloader_idx_0", "val_acc/dataloader_idx_1", "val_loss/dataloader_idx_1"} <= set(metrics)


def test_sources_that_cannot_be_mixed_are_refused_naming_them(image_folder: Path, tmp_path: Path) -> None:
    numbered = []
    for k in range(2):
        path = tmp_path / f"n{k}.h5"
        with h5py.File(path, "w") as f:  # no classes attribute: classes named "0", "1"
            f["images"] = np.zeros((4, 8, 8, 3), np.uint8)
            f["labels"] = np.array([0, 1, 0, 1])
        numbered.append(HDF5DataModule(str(path), image_size=8))
    mix = MixedDataModule(numbered, image_size=8)  # the sources' classes are read when first needed
    with pytest.raises(ValueError, match="by number only"):
        mix.num_classes  # noqa: B018 - LightningCLI's link (or setup) reads them
    folder = ImageFolderDataModule(str(image_folder), image_size=16)
    with pytest.raises(ValueError, match="image_size differ"):
        MixedDataModule([folder, ImageFolderDataModule(str(image_folder), image_size=24)], image_size=16)
    with pytest.raises(ValueError, match="2 values for 1 datamodules"):
        MixedDataModule([folder], weights=[1.0, 2.0], image_size=16)
    with pytest.raises(ValueError, match="positive"):
        MixedDataModule([folder], weights=[0.0], image_size=16)
    with pytest.raises(ValueError, match="give sample_weights and classes to its sources"):
        MixedDataModule([folder], sample_weights="balanced", image_size=16)


def drawn_sources_and_names(mix: MixedDataModule) -> list[tuple[int, int, str]]:
    """Each draw of epoch 0: (source, index in the source, the class name its label says in the mix)."""
    drawn = mix.train_dataloader().sampler.drawn(0)
    found = []
    for index in drawn.tolist():
        s, local = mix.train_dataset.source_of(index)
        found.append((s, local, mix.classes[int(mix.train_dataset.targets[index])]))
    return found


@pytest.mark.timeout(300)
def test_a_sources_classes_are_honoured_by_name_in_training_and_validation(image_folder: Path, second: Path) -> None:
    """A source with ``classes=`` (2 of its 3, reordered): only those drawn and validated, each labelled by its name."""
    kw: dict[str, Any] = dict(image_size=16, val_fraction=0.3)
    picked = ImageFolderDataModule(str(image_folder), classes=["class_002", "class_000"], **kw)
    mix = MixedDataModule([picked, HDF5DataModule(str(second), **kw)], epoch_size=400, image_size=16, batch_size=16,
                          num_workers=2)  # fmt: skip
    assert mix.classes == ("class_002", "class_000", "class_001", "class_009")
    mix.setup("fit")
    truth = [np.asarray(source.targets) for source in mix.train_dataset.sources]
    draws = drawn_sources_and_names(mix)
    for s, local, name in draws:
        assert name == mix.datamodules[s].data_classes[int(truth[s][local])]
    assert {name for s, _, name in draws if s == 0} == {"class_002", "class_000"}
    # through the workers: the batches' labels are the draws' labels (the first batch used to raise IndexError)
    labels = Counter(int(x) for _, batch in mix.train_dataloader() for x in batch.tolist())
    assert labels == Counter(mix.classes.index(name) for _, _, name in draws)
    # validation: the source's own classes only, labelled in the mix's list
    folder_val = mix.val_dataloader()[0]
    val_labels = [mix.classes[int(x)] for _, batch in folder_val for x in batch.tolist()]
    val_truth = [picked.data_classes[int(t)] for t in np.asarray(mix.val_datasets[0].targets)]  # type: ignore[attr-defined]
    assert sorted(val_labels) == sorted(n for n in val_truth if n in ("class_002", "class_000"))


@pytest.mark.timeout(300)
def test_a_sources_weights_max_per_class_and_fraction_hold_within_its_share(image_folder: Path, second: Path) -> None:
    kw: dict[str, Any] = dict(image_size=16, val_fraction=0.0)

    def mix_of(**source: Any) -> MixedDataModule:
        sources = [ImageFolderDataModule(str(image_folder), **kw, **source), HDF5DataModule(str(second), **kw)]
        dm = MixedDataModule(sources, weights=[1.0, 1.0], epoch_size=3000, image_size=16, batch_size=16)
        dm.setup("fit")
        return dm

    weighted = drawn_sources_and_names(mix_of(sample_weights={"class_000": 4.0}))
    per_class = Counter(name for s, _, name in weighted if s == 0)
    shares = np.array([per_class["class_000"], per_class["class_001"], per_class["class_002"]])
    assert chi_square(shares, np.array([4.0, 1.0, 1.0]) / 6 * shares.sum()) < CHI2_999[2], shares
    assert chi_square([shares.sum(), len(weighted) - shares.sum()], [1500.0, 1500.0]) < CHI2_999[1]
    capped = drawn_sources_and_names(mix_of(max_per_class=2))
    seen = {(local, name) for s, local, name in capped if s == 0}
    assert len(seen) == 6 and Counter(name for _, name in seen) == {"class_000": 2, "class_001": 2, "class_002": 2}
    part = drawn_sources_and_names(mix_of(fraction=0.25))
    assert len({local for s, local, _ in part if s == 0}) == 10  # round(39 * 0.25)


def test_a_sources_epoch_size_or_draws_without_replacement_are_refused_naming_them(image_folder: Path) -> None:
    for source, named in (({"epoch_size": 10}, "epoch_size=10"), ({"replacement": False}, "replacement=False")):
        dm = ImageFolderDataModule(str(image_folder), image_size=16, sample_weights="balanced", **source)
        with pytest.raises(ValueError, match=rf"Source 0:ImageFolderDataModule sets {named}"):
            MixedDataModule([dm], image_size=16)
