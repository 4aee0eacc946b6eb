"""``trainer.predict`` on the DataModules: what is read (folders, lists, buckets), in what order, and the table."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.s3_server import LocalS3
from lightning_fastdata import (
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    PredictionWriter,
    convert_folder_to_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.testing import cpu_trainer


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    """Nested and flat: the image folder's class sub-folders, two images at the top, one non-image file."""
    root = tmp_path_factory.mktemp("unlabelled") / "new"
    shutil.copytree(image_folder, root)
    top = sorted((root / "class_000").iterdir())[:2]
    for i, image in enumerate(top):
        shutil.copy(image, root / f"top_{i}.jpg")
    (root / "notes.txt").write_text("not an image")
    return root


def walk_images(root: Path) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(root):
        found += [os.path.relpath(os.path.join(dirpath, n), root) for n in names if n.endswith(".jpg")]
    return sorted(found)


def predict(dm: Any, tmp_path: Path, top_k: int = 2, **trainer_kw: Any) -> list[list[str]]:
    out = tmp_path / "predictions" / "table.csv"
    model = ImageClassifier(num_classes=dm.num_classes)
    trainer = cpu_trainer(PredictionWriter(str(out), top_k=top_k), **trainer_kw)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    with open(out, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.timeout(180)
def test_a_nested_folder_is_predicted_in_path_order_through_workers(
    image_folder: Path, unlabelled: Path, tmp_path: Path
) -> None:
    dm = ImageFolderDataModule(
        str(image_folder), predict_root=str(unlabelled), image_size=32, batch_size=4, num_workers=2
    )
    rows = predict(dm, tmp_path, top_k=2)
    assert rows[0] == ["path", "class_1", "prob_1", "class_2", "prob_2"]
    expected = walk_images(unlabelled)
    assert len(expected) == 41  # 39 nested + 2 at the top; notes.txt is not an image
    assert [r[0] for r in rows[1:]] == [str(unlabelled / p) for p in expected]
    for row in rows[1:]:
        assert row[1] in dm.classes and row[3] in dm.classes and row[1] != row[3]
        p1, p2 = float(row[2]), float(row[4])
        assert 1 >= p1 >= p2 >= 0 and p1 + p2 <= 1 + 1e-5
    assert not [p for p in (tmp_path / "predictions").iterdir() if p.name != "table.csv"]  # no temporary left
    # through the workers, the batches name their second field: indices here, labels in training and evaluation
    from lightning_fastdata.loading.batch import Batch, PredictBatch

    dm.setup("predict")
    first = next(iter(dm.predict_dataloader()))
    assert isinstance(first, PredictBatch) and first.indices.tolist() == [0, 1, 2, 3]
    dm.setup("fit")
    for batch in (next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))):
        assert isinstance(batch, Batch) and batch.labels.dtype == torch.int64 and len(batch.labels) == 4


@pytest.mark.slow  # over 7 s on the 2-core VM (the project's rule: over ~4 s is the slow tier)
@pytest.mark.timeout(180)
def test_a_text_file_of_paths_keeps_its_order_on_any_datamodule(
    image_folder: Path, unlabelled: Path, tmp_path: Path
) -> None:
    """A ``.txt`` list (relative to its folder, or absolute; comments and blank lines skipped) keeps its order, and
    the HDF5 module predicts on it too (every DataModule takes ``predict_root``)."""
    chosen = walk_images(unlabelled)[::-5]
    listing = unlabelled.parent / "to_predict.txt"
    lines = ["# newest first", ""] + [f"new/{p}" for p in chosen[:-1]] + [str(unlabelled / chosen[-1])]
    listing.write_text("\n".join(lines) + "\n")
    h5 = convert_folder_to_hdf5(image_folder, tmp_path / "train.h5", processes=1, progress=False)
    # a Path, as users pass root (it failed in prediction_index: 'PosixPath' object has no attribute 'endswith')
    dm = HDF5DataModule(str(h5), predict_root=listing, image_size=32, batch_size=3, num_workers=0)  # type: ignore[arg-type]
    rows = predict(dm, tmp_path, top_k=1)
    assert [os.path.normpath(r[0]) for r in rows[1:]] == [str(unlabelled / p) for p in chosen]
    assert np.allclose([float(r[2]) for r in rows[1:]], [float(r[2]) for r in rows[1:]])  # parsed


def test_bad_prediction_inputs_are_named(image_folder: Path, tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("a/missing.jpg\n")
    dm = ImageFolderDataModule(str(image_folder), predict_root=str(listing))
    with pytest.raises(FileNotFoundError, match=r"1 of the 1 images listed in .*list.txt.*missing.jpg"):
        dm.setup("predict")
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no image under .*empty"):
        ImageFolderDataModule(str(image_folder), predict_root=str(empty)).setup("predict")
    plain = ImageFolderDataModule(str(image_folder))
    plain.setup("predict")
    with pytest.raises(ValueError, match="pass predict_root="):
        plain.predict_dataloader()
    with pytest.raises(ValueError, match="top_k should be a positive int"):
        PredictionWriter(str(tmp_path / "t.csv"), top_k=0)


@pytest.mark.timeout(180)
def test_a_bucket_prefix_is_predicted_in_key_order(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    dm = ImageFolderDataModule(
        s3_image_folder,
        predict_root=s3_image_folder,
        storage_options=s3.storage_options(),
        image_size=32,
        batch_size=8,
        num_workers=2,
    )
    rows = predict(dm, tmp_path, top_k=1)
    expected = [f"{s3_image_folder}/{p}" for p in walk_images(image_folder)]
    assert [r[0] for r in rows[1:]] == expected


@pytest.mark.timeout(120)
def test_a_test_set_is_tested_with_the_validation_transforms(image_folder: Path, tmp_path: Path) -> None:
    """``test_root``: every image once, centre crops (the same batches twice), ``test_loss``/``test_acc`` reported;
    no test set: the error names ``test_root``."""
    extra = make_image_folder(tmp_path / "test", num_classes=3, per_class=3, size=(64, 48), seed=9)
    dm = ImageFolderDataModule(
        str(image_folder), test_root=str(extra), image_size=32, batch_size=4, num_workers=2, val_fraction=0
    )
    dm.setup("test")
    first = [b[0].clone() for b in dm.test_dataloader()]
    second = [b[0] for b in dm.test_dataloader()]
    assert sum(len(b) for b in first) == 9 and all((a == b).all() for a, b in zip(first, second))
    result = cpu_trainer().test(ImageClassifier(num_classes=3), datamodule=dm, verbose=False)[0]
    assert {"test_loss", "test_acc"} <= result.keys()
    plain = ImageFolderDataModule(str(image_folder))
    plain.setup("test")
    with pytest.raises(ValueError, match="pass test_root="):
        plain.test_dataloader()
    other = make_image_folder(tmp_path / "other", num_classes=2, per_class=2, size=(32, 24))
    with pytest.raises(ValueError, match="test_root .* has class folders"):
        ImageFolderDataModule(str(image_folder), test_root=str(other)).setup("test")


@pytest.mark.timeout(120)
def test_without_the_datamodule_the_table_names_classes_by_the_models_checkpoint(
    image_folder: Path, unlabelled: Path, tmp_path: Path
) -> None:
    """A loader passed alone (no DataModule on the Trainer): rows are named by index, classes by the model's own
    ``class_names`` (what ``ImageClassifier`` keeps in its checkpoint)."""
    dm = ImageFolderDataModule(str(image_folder), predict_root=str(unlabelled), image_size=32, batch_size=8)
    dm.setup("predict")

    class FromUint8(ImageClassifier):  # without the DataModule's hook the batches stay uint8
        def forward(self, images: Any) -> Any:
            return super().forward(images.float() / 255)

    model = FromUint8(num_classes=3, class_names=["cat", "dog", "fox"])
    out = tmp_path / "t.csv"
    cpu_trainer(PredictionWriter(str(out), top_k=3)).predict(model, dm.predict_dataloader(), return_predictions=False)
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(41)]
    assert {r[1] for r in rows[1:]} <= {"cat", "dog", "fox"} and sorted(rows[1][1::2][:3]) == ["cat", "dog", "fox"]


@pytest.mark.timeout(180)
def test_the_tensor_cache_module_tests_on_the_centre_crops_it_keeps_for_validation(
    image_folder: Path, tmp_path: Path
) -> None:
    """``TensorCacheDataModule(test_root=...)`` decodes the test folder with the validation transforms: the same
    pixels as the cache's own validation split of that folder, and ``trainer.test`` reports on it."""
    from lightning_fastdata import TensorCacheDataModule

    extra = make_image_folder(tmp_path / "held", num_classes=3, per_class=3, size=(80, 60), seed=4)
    kw: dict[str, Any] = dict(image_size=32, batch_size=4, num_workers=2, cache_size=40, build_processes=1)
    dm = TensorCacheDataModule(
        str(image_folder), str(tmp_path / "cache"), val_root=str(extra), test_root=str(extra), **kw
    )
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    val = [(b[0].clone(), b[1].clone()) for b in dm.val_dataloader()]
    test = [(b[0].clone(), b[1].clone()) for b in dm.test_dataloader()]
    assert len(val) == len(test) == 3
    for (vi, vl), (ti, tl) in zip(val, test):
        assert (vl == tl).all() and torch.equal(vi, ti)
    result = cpu_trainer().test(ImageClassifier(num_classes=3), datamodule=dm, verbose=False)[0]
    assert {"test_loss", "test_acc"} <= result.keys()


def test_a_rank_given_no_input_adds_no_rows_to_the_table() -> None:
    """More ranks than images: a rank's empty part (no rows, no columns) joins the others' without a shape error."""
    from lightning_fastdata.callbacks import predictions

    empty = predictions._join([])
    full = (np.array([1, 0]), np.array([[2, 0], [1, 2]]), np.array([[0.7, 0.2], [0.5, 0.4]], np.float32))
    index, classes, probs = predictions._join([empty, full])
    assert index.tolist() == [1, 0] and classes.shape == (2, 2) and probs.shape == (2, 2)


def fixed_model(rows: torch.Tensor, said: str | None) -> Any:
    import lightning.pytorch as pl

    class Model(pl.LightningModule):
        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return rows[batch[1]]

    model = Model()
    if said is not None:
        model.prediction_scores = said  # type: ignore[attr-defined]
    return model


def written(tmp_path: Path, dm: Any, model: Any, **writer: Any) -> list[list[str]]:
    out = tmp_path / "t.csv"
    cpu_trainer(PredictionWriter(str(out), top_k=3, **writer)).predict(model, datamodule=dm, return_predictions=False)
    with open(out, newline="") as f:
        return list(csv.reader(f))[1:]


def test_the_writer_writes_what_the_model_says_its_rows_are(image_folder: Path, tmp_path: Path) -> None:
    """A multi-label model's independent probabilities are written as they are (they were put through a softmax:
    0.673/0.475/0.432 came out 0.384/0.315/0.301); logits get a softmax or a sigmoid as said; nothing is guessed."""
    dm = ImageFolderDataModule(str(image_folder), predict_root=str(image_folder / "class_000"), image_size=16,
                               batch_size=4, num_workers=0)  # fmt: skip
    n = 13
    sigmoids = torch.tensor([[0.673, 0.475, 0.432]]).repeat(n, 1)
    rows = written(tmp_path, dm, fixed_model(sigmoids, "multi_label_probabilities"))
    assert len(rows) == n and rows[0][1:] == ["class_000", "0.673000", "class_001", "0.475000", "class_002", "0.432000"]
    # ImageClassifier says so itself with multi_label=True: its sigmoids, unchanged
    model = ImageClassifier(num_classes=3, multi_label=True)
    assert model.prediction_scores == "multi_label_probabilities"
    logits = torch.tensor([[2.0, 0.0, -1.0]]).repeat(n, 1)
    soft = written(tmp_path, dm, fixed_model(logits, None), scores="logits")[0]
    assert [float(v) for v in soft[2::2]] == pytest.approx(logits[0].softmax(0).tolist(), abs=1e-6)
    sig = written(tmp_path, dm, fixed_model(logits, "multi_label_logits"))[0]
    assert [float(v) for v in sig[2::2]] == pytest.approx(logits[0].sigmoid().tolist(), abs=1e-6)
    with pytest.raises(
        ValueError, match=r"does not know what Model.predict_step returns: pass PredictionWriter\(scores"
    ):
        written(tmp_path, dm, fixed_model(logits, None))
    with pytest.raises(ValueError, match="told the model's rows are probabilities.*say 'logits'"):
        written(tmp_path, dm, fixed_model(logits, "probabilities"))
    with pytest.raises(ValueError, match="scores should be one of"):
        PredictionWriter(str(tmp_path / "t.csv"), scores="softmax")  # type: ignore[arg-type]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_unlabelled_shards_are_predicted_in_order_and_named_by_shard_and_sample(
    image_folder: Path, tmp_path: Path, fmt: str
) -> None:
    """``predict_root`` naming shards without labels (no ``.cls`` members; no label column), each sample once in order
    through 2 workers, its row in the table named ``shard.tar:key`` / ``file.parquet:row N``; the same images as
    the folder they were written from, so the same predictions."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from lightning_fastdata import ShardDataModule
    from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards

    train = (write_tar_shards if fmt == "tar" else write_parquet_shards)(image_folder, tmp_path / "train", 10**9)
    files = sorted(p for p in image_folder.rglob("*.jpg"))
    if fmt == "tar":
        new = tmp_path / "new" / "new-000000.tar"
        new.parent.mkdir()
        with tarfile.open(new, "w") as tf:
            for k, path in enumerate(files):
                info = tarfile.TarInfo(f"{k:04d}.jpg")
                info.size = path.stat().st_size
                tf.addfile(info, io.BytesIO(path.read_bytes()))
    else:
        new = tmp_path / "new" / "new-000000.parquet"
        new.parent.mkdir()
        pq.write_table(pa.table({"image": [p.read_bytes() for p in files]}), new, row_group_size=8)
    kw = dict(index_dir=str(tmp_path / "idx"), image_size=32, batch_size=4, num_workers=2)
    dm = ShardDataModule(str(train[0].parent), predict_root=str(new), **kw)
    rows = predict(dm, tmp_path, top_k=1)
    names = (
        [f"{new}:{k:04d}" for k in range(len(files))]
        if fmt == "tar"
        else [f"{new}:row {k} (row group {k // 8})" for k in range(len(files))]
    )
    assert [r[0] for r in rows[1:]] == names
    same = ImageFolderDataModule(str(image_folder), predict_root=str(image_folder), image_size=32, batch_size=4)
    torch.manual_seed(0)
    ours = torch.cat([b[0] for b in _predict_batches(dm)])
    theirs = torch.cat([b[0] for b in _predict_batches(same)])
    assert torch.equal(ours, theirs)  # the same images, in the same order, the same validation transforms


def _predict_batches(dm: Any) -> list[Any]:
    dm.setup("predict")
    return list(dm.predict_dataloader())
