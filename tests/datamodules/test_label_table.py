"""Labels from a table (the Kaggle layout: a flat folder and a CSV or Parquet of ids and labels), on every module."""

from __future__ import annotations

import csv
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from lightning_fastdata import (
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    TensorCacheDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.models import average_precision
from lightning_fastdata.testing import cpu_trainer

#: Labels of the 21 images (numbers: sorted as numbers, "2" before "10"), and each image's tags (several labels).
NUMBERS = ["10", "2", "7"]
TAGS = ["cat", "dog", "sky", "sea"]


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """21 images in one flat folder, ``img_000.jpg``..., and what their tables say about each."""
    base = tmp_path_factory.mktemp("kaggle")
    src = make_image_folder(base / "src", num_classes=3, per_class=7, size=(48, 40))
    flat = base / "train"
    flat.mkdir()
    single, several = {}, {}
    for k, image in enumerate(sorted(src.rglob("*.jpg"))):
        name = f"img_{k:03d}.jpg"
        shutil.copy(image, flat / name)
        single[name] = NUMBERS[k % 3]
        several[name] = [t for j, t in enumerate(TAGS) if (k >> j) & 1]  # every subset of 4 tags, the empty one too
    return {"base": base, "flat": flat, "single": single, "several": several}


def write_csv(path: Path, rows: list[list[str]]) -> str:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return str(path)


def single_table(kaggle: dict[str, Any], path: Path) -> str:
    # ids with and without the extension: both name the file
    rows = [[name if k % 2 else name[:-4], label] for k, (name, label) in enumerate(kaggle["single"].items())]
    return write_csv(path, [["id", "label"], *rows])


def epoch_labels(dm: Any) -> list[Any]:
    dm.setup("fit")
    return [row for _, labels in dm.train_dataloader() for row in labels.tolist()]


@pytest.mark.timeout(120)
def test_one_label_per_image_from_a_csv_through_workers(kaggle: dict[str, Any], tmp_path: Path) -> None:
    table = single_table(kaggle, tmp_path / "train.csv")
    dm = ImageFolderDataModule(str(kaggle["flat"]), labels=table, image_size=16, batch_size=4, num_workers=2,
                               val_fraction=0)  # fmt: skip
    assert dm.classes == ("2", "7", "10") and dm.num_classes == 3 and not dm.multi_label
    served = epoch_labels(dm)
    # every image once, each with its row's label (positions in the class list)
    assert Counter(served) == Counter(dm.classes.index(v) for v in kaggle["single"].values())
    dataset = dm.train_dataset
    for i in range(len(dataset)):
        assert dm.classes[dataset[i][1]] == kaggle["single"][dataset.index.relpath(i)]
    # the stated class list, in another order: the labels follow it
    stated = ImageFolderDataModule(str(kaggle["flat"]), labels=table, class_names=["7", "10", "2"], image_size=16)
    stated.setup("fit")
    assert stated.classes == ("7", "10", "2")
    first = stated.train_dataset.index.relpath(0)
    assert stated.classes[int(stated.train_dataset.targets[0])] == kaggle["single"][first]


#: Class names with spaces, as ChestX-ray14's ``Finding Labels`` and ImageNet's names have them.
SPACED = ["golden retriever", "sea lion", "Pleural_Thickening", "No Finding"]


@pytest.mark.timeout(120)
def test_a_separator_keeps_class_names_with_spaces_whole(kaggle: dict[str, Any], tmp_path: Path) -> None:
    """``label_separator="|"``: ``golden retriever|sea lion`` is two labels, not four; a single label keeps its spaces
    (one label per image: the whole cell); the converter takes the same argument."""
    names = list(kaggle["several"])
    wanted = {n: [SPACED[j] for j, t in enumerate(TAGS) if t in kaggle["several"][n]] for n in names}
    piped = write_csv(
        tmp_path / "piped.csv", [["Image Index", "Finding Labels"], *[[n, "|".join(wanted[n])] for n in names]]
    )
    kw: dict[str, Any] = dict(multi_label=True, image_size=16, batch_size=4, num_workers=0, val_fraction=0)
    dm = ImageFolderDataModule(str(kaggle["flat"]), labels=piped, label_separator="|", **kw)
    assert dm.classes == tuple(sorted(SPACED))
    dm.setup("fit")
    for i in range(21):
        got = {dm.classes[c] for c in np.flatnonzero(dm.train_dataset.targets[i])}
        assert got == set(wanted[dm.train_dataset.index.relpath(i)])
    # without the separator the same table is read by spaces: "golden", "retriever|sea", ... (what users hit)
    assert "golden" in ImageFolderDataModule(str(kaggle["flat"]), labels=piped, **kw).classes
    h5 = convert_folder_to_hdf5(kaggle["flat"], tmp_path / "piped.h5", labels=piped, multi_label=True,
                                label_separator="|", processes=1, progress=False)  # fmt: skip
    assert HDF5DataModule(str(h5), image_size=16).classes == tuple(sorted(SPACED))
    one = write_csv(tmp_path / "one.csv", [["id", "label"], *[[n, SPACED[k % 2]] for k, n in enumerate(names)]])
    single = ImageFolderDataModule(str(kaggle["flat"]), labels=one, image_size=16)
    assert single.classes == ("golden retriever", "sea lion")
    with pytest.raises(ValueError, match="label_separator should be"):
        ImageFolderDataModule(str(kaggle["flat"]), labels=piped, label_separator="", **kw)


@pytest.mark.timeout(120)
def test_several_labels_space_separated_or_a_column_per_class_are_the_same_rows(
    kaggle: dict[str, Any], tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(kaggle["several"])
    spaced = write_csv(
        tmp_path / "spaced.csv", [["image", "tags"], *[[n, " ".join(kaggle["several"][n])] for n in names]]
    )
    columns = [["image", *TAGS], *[[n, *("1" if t in kaggle["several"][n] else "0" for t in TAGS)] for n in names]]
    per_class = write_csv(tmp_path / "columns.csv", columns)
    parquet = tmp_path / "columns.parquet"
    pq.write_table(pa.table({"image": names, **{t: [int(t in kaggle["several"][n]) for n in names] for t in TAGS}}),
                   parquet)  # fmt: skip
    kw: dict[str, Any] = dict(multi_label=True, image_size=16, batch_size=4, num_workers=2, val_fraction=0)
    modules = [ImageFolderDataModule(str(kaggle["flat"]), labels=t, **kw) for t in (spaced, per_class, str(parquet))]
    assert modules[0].classes == tuple(sorted(TAGS))  # found labels, sorted
    assert modules[1].classes == modules[2].classes == tuple(TAGS)  # the columns' order
    for dm in modules:
        dm.setup("fit")
        targets = dm.train_dataset.targets
        assert targets.dtype == np.uint8 and targets.shape == (21, 4)
        for i in range(21):
            got = {dm.classes[c] for c in np.flatnonzero(targets[i])}
            assert got == set(kaggle["several"][dm.train_dataset.index.relpath(i)])
        rows = epoch_labels(dm)  # through the workers: each image's row once
        assert sorted(map(tuple, rows)) == sorted(map(tuple, targets.tolist()))
    # MixUp on the device mixes the rows as they are: soft targets, each a blend of two rows
    mixing = ImageFolderDataModule(str(kaggle["flat"]), labels=spaced, batch_transforms=v2.MixUp(alpha=1.0), **kw)
    mixing.setup("fit")
    batch = next(iter(mixing.train_dataloader()))  # images, multi-hot rows and keys (for the device's draws)
    rows = batch.labels.clone()
    _, soft = mixing.on_after_batch_transfer(mixing.transfer_batch_to_device(batch, torch.device("cpu"), 0), 0)
    assert soft.dtype == torch.float32 and soft.shape == (4, 4)
    assert ((soft >= 0) & (soft <= 1)).all() and not torch.equal(soft, rows.float())
    assert rows.dtype == torch.uint8


@pytest.mark.parametrize(
    ("rows", "kwargs", "says"),
    [
        ([["id", "label"], ["img_000", "a"], ["nope", "b"]], {}, ["'nope'", "have no image under"]),
        ([["id", "label"], ["img_000", "a"]], {}, ["20 of the 21 images", "img_001.jpg", "have no row"]),
        ([["id", "label"], ["img_000", "a"], ["img_000.jpg", "b"]], {}, ["'img_000'", "'img_000.jpg'", "both name"]),
        ([["id", "label"], ["img_000", "a"], ["img_000", "b"]], {}, ["more than once", "'img_000'"]),
        ([["id", "a", "b"], ["img_000", "1", "0"]], {}, ["3 columns", "multi_label=True"]),
        ([["id", "a", "b"], ["img_000", "1", "2"]], {"multi_label": True}, ["row 2", "'b'", "0 or 1"]),
        ([["id", "label"], ["img_000", "a"], ["img_001", "zebra"]], {"class_names": ["a"]}, ["'zebra'", "row 3"]),
        ([["id", "label"], ["img_000", ""]], {}, ["row 2", "has no label"]),
        ([["id"], ["img_000"]], {}, ["needs an id column and a label column"]),
    ],
    ids=[
        "id-without-file",
        "file-without-row",
        "two-ids-one-file",
        "id-twice",
        "columns-without-multi-label",
        "not-0-or-1",
        "unknown-class",
        "empty-label",
        "one-column",
    ],  # fmt: skip
)
def test_a_table_that_does_not_fit_is_an_error_naming_what(
    kaggle: dict[str, Any], tmp_path: Path, rows: list[list[str]], kwargs: dict[str, Any], says: list[str]
) -> None:
    if "have no row" not in says[-1]:  # every other case labels all 21 files, but for its own faulty rows
        named = {r[0].removesuffix(".jpg") for r in rows[1:]}
        filler = [c or "a" for c in rows[1][1:]]
        rows = rows + [[n[:-4], *filler] for n in kaggle["single"] if n[:-4] not in named]
    table = write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(ValueError) as err:
        ImageFolderDataModule(str(kaggle["flat"]), labels=table, **kwargs).setup("fit")
    for text in says:
        assert text in str(err.value), str(err.value)
    assert "bad.csv" in str(err.value)


def test_label_arguments_without_a_table_and_a_missing_table_are_errors(kaggle: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="pass labels="):
        ImageFolderDataModule(str(kaggle["flat"]), multi_label=True)
    with pytest.raises(FileNotFoundError, match="missing.csv"):  # read when first needed (setup, num_classes)
        ImageFolderDataModule(str(kaggle["flat"]), labels=str(kaggle["base"] / "missing.csv")).setup("fit")


@pytest.mark.timeout(300)
def test_the_tensor_cache_and_the_hdf5_converter_keep_a_tables_labels(kaggle: dict[str, Any], tmp_path: Path) -> None:
    names = list(kaggle["several"])
    table = write_csv(tmp_path / "tags.csv", [["id", "tags"], *[[n, " ".join(kaggle["several"][n])] for n in names]])
    kw: dict[str, Any] = dict(image_size=16, batch_size=4, num_workers=2, val_fraction=0)
    folder = ImageFolderDataModule(str(kaggle["flat"]), labels=table, multi_label=True, **kw)
    folder.setup("fit")
    expected = folder.train_dataset.targets
    cache = TensorCacheDataModule(str(kaggle["flat"]), str(tmp_path / "cache"), cache_size=20, labels=table,
                                  multi_label=True, build_processes=1, **kw)  # fmt: skip
    cache.prepare_data()
    cache.setup("fit")
    assert cache.multi_label and cache.classes == folder.classes
    assert np.array_equal(cache.train_dataset.targets, expected) and cache.train_dataset.targets.dtype == np.uint8
    assert sorted(map(tuple, epoch_labels(cache))) == sorted(map(tuple, expected.tolist()))
    # a changed table is a changed source: the cache is built again, with the new labels
    write_csv(tmp_path / "tags.csv", [["id", "tags"], *[[n, "cat"] for n in names]])
    again = TensorCacheDataModule(str(kaggle["flat"]), str(tmp_path / "cache"), cache_size=20, labels=table,
                                  multi_label=True, build_processes=1, **kw)  # fmt: skip
    again.prepare_data()
    again.setup("fit")
    assert again.classes == ("cat",) and again.train_dataset.targets.sum() == 21
    # HDF5: the converter writes the multi-hot rows, the module reads them back as they are
    write_csv(tmp_path / "tags.csv", [["id", "tags"], *[[n, " ".join(kaggle["several"][n])] for n in names]])
    h5 = convert_folder_to_hdf5(kaggle["flat"], tmp_path / "tags.h5", labels=table, multi_label=True, processes=1,
                                progress=False)  # fmt: skip
    dm = HDF5DataModule(str(h5), **kw)
    assert dm.multi_label and dm.classes == folder.classes
    dm.setup("fit")
    assert np.array_equal(dm.train_dataset.targets, expected)
    assert sorted(map(tuple, epoch_labels(dm))) == sorted(map(tuple, expected.tolist()))


@pytest.mark.timeout(180)
def test_a_multi_label_classifier_trains_and_evaluates_on_a_table(kaggle: dict[str, Any], tmp_path: Path) -> None:
    names = list(kaggle["several"])
    table = write_csv(tmp_path / "tags.csv", [["id", "tags"], *[[n, " ".join(kaggle["several"][n])] for n in names]])
    dm = ImageFolderDataModule(str(kaggle["flat"]), labels=table, multi_label=True, test_root=str(kaggle["flat"]),
                               image_size=16, batch_size=4, num_workers=2, val_fraction=0.3)  # fmt: skip
    model = ImageClassifier(num_classes=dm.num_classes, multi_label=True, class_names=list(dm.classes))
    trainer = cpu_trainer(max_epochs=1)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert {"test_loss", "test_map", "test_f1"} <= metrics.keys()
    assert 0 <= metrics["test_map"] <= 1 and 0 <= metrics["test_f1"] <= 1
    # the same figures from the model's probabilities, computed here over every test image
    dm.setup("test")
    scores, targets = [], []
    model.eval()
    with torch.no_grad():
        for images, labels in dm.test_dataloader():
            images, labels = dm.on_after_batch_transfer((images, labels), 0)
            scores.append(model(images).sigmoid())
            targets.append(labels.float())
    s, t = torch.cat(scores), torch.cat(targets)
    assert len(s) == 21
    assert abs(average_precision(s, t).nanmean().item() - metrics["test_map"]) < 1e-5
    f1 = 2 * ((s > 0.5) & (t > 0.5)).sum() / ((s > 0.5).sum() + (t > 0.5).sum())
    assert abs(f1.item() - metrics["test_f1"]) < 1e-5


def test_average_precision_is_the_mean_precision_at_each_positive() -> None:
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.7], [0.3, 0.2], [0.1, 0.6]])
    targets = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 0]])
    ap = average_precision(scores, targets)
    assert abs(ap[0].item() - (1 / 1 + 2 / 3) / 2) < 1e-9  # positives at ranks 1 and 3
    assert torch.isnan(ap[1])  # no positive: left out of the mean
    # brute force on random data
    g = torch.Generator().manual_seed(0)
    s, t = torch.rand(50, 6, generator=g), (torch.rand(50, 6, generator=g) > 0.6).long()
    for c in range(6):
        order = s[:, c].argsort(descending=True)
        hits = t[order, c]
        ranks = torch.nonzero(hits).flatten() + 1
        expect = sum((k + 1) / r.item() for k, r in enumerate(ranks)) / len(ranks)
        assert abs(average_precision(s, t)[c].item() - expect) < 1e-9


@pytest.mark.timeout(120)
def test_chestxray14s_own_table_of_eleven_columns_is_read_by_naming_its_two(
    kaggle: dict[str, Any], tmp_path: Path
) -> None:
    """ChestX-ray14's ``Data_Entry_2017.csv`` as it ships: ``Image Index``, ``Finding Labels`` and nine more columns.
    It was taken as one column per class and refused ('a column per class takes 0 or 1'), with no argument to name
    the two columns; ``id_column``/``label_column`` read it as the two-column table, for the cache module too."""
    from lightning_fastdata import TensorCacheDataModule

    names = list(kaggle["several"])
    wanted = {n: [SPACED[j] for j, t in enumerate(TAGS) if t in kaggle["several"][n]] for n in names}
    extra = ["Follow-up #", "Patient ID", "Patient Age", "Patient Gender", "View Position", "OriginalImage[Width",
             "Height]", "OriginalImagePixelSpacing[x", "y]"]  # fmt: skip
    rows = [[n, "|".join(wanted[n]) or "No Finding", *[str(k) for k in range(9)]] for n in names]
    table = write_csv(tmp_path / "Data_Entry_2017.csv", [["Image Index", "Finding Labels", *extra], *rows])
    kw: dict[str, Any] = dict(multi_label=True, label_separator="|", image_size=16, batch_size=4, num_workers=0,
                              val_fraction=0)  # fmt: skip
    with pytest.raises(ValueError, match="a column per class takes 0 or 1"):
        ImageFolderDataModule(str(kaggle["flat"]), labels=table, **kw).setup("fit")
    columns = dict(id_column="Image Index", label_column="Finding Labels")
    dm = ImageFolderDataModule(str(kaggle["flat"]), labels=table, **columns, **kw)
    assert set(dm.classes) <= set(SPACED)
    dm.setup("fit")
    for i in range(len(dm.train_dataset)):
        got = {dm.classes[c] for c in np.flatnonzero(dm.train_dataset.targets[i])}
        assert got == (set(wanted[dm.train_dataset.index.relpath(i)]) or {"No Finding"})
    cached = TensorCacheDataModule(str(kaggle["flat"]), cache_dir=str(tmp_path / "cache"), labels=table, **columns,
                                   **kw)  # fmt: skip
    assert cached.classes == dm.classes
    h5 = convert_folder_to_hdf5(kaggle["flat"], tmp_path / "chest.h5", labels=table, multi_label=True,
                                label_separator="|", processes=1, progress=False, **columns)  # fmt: skip
    assert HDF5DataModule(str(h5), image_size=16).classes == dm.classes
    with pytest.raises(ValueError, match=r"has no column 'Findings'; its columns are \['Image Index', 'Finding"):
        ImageFolderDataModule(
            str(kaggle["flat"]), labels=table, id_column="Image Index", label_column="Findings"
        ).setup("fit")
    with pytest.raises(ValueError, match="id_column and label_column name a label table's columns: pass labels="):
        ImageFolderDataModule(str(kaggle["flat"]), label_column="Finding Labels")
