from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from benchmarks.s3_server import LocalS3
from lightning_fastdata import (
    DataWaitMonitor,
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.testing import cpu_trainer


class Recorder(pl.Callback):
    """Records what the model receives, after the DataModule's transfer hooks."""

    def __init__(self) -> None:
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batches.append((batch[0].detach().clone(), batch[1].clone()))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_fit_end_to_end(image_folder: Path, workers: int) -> None:
    dm = ImageFolderDataModule(str(image_folder), image_size=32, batch_size=8, num_workers=workers, val_fraction=0.2)
    model = ImageClassifier(num_classes=dm.num_classes)
    recorder, monitor = Recorder(), DataWaitMonitor(log_every_n_steps=1)
    trainer = cpu_trainer(recorder, monitor, epochs=2)
    trainer.fit(model, dm)
    assert isinstance(trainer.train_dataloader, StatefulDataLoader)
    assert trainer.train_dataloader.num_workers == workers
    # 39 images, 8 held out: 31 train = 4 batches per epoch, the last one partial
    assert len(recorder.batches) == 8 and [len(y) for _, y in recorder.batches[:4]] == [8, 8, 8, 7]
    images, _ = recorder.batches[0]
    assert images.dtype == torch.float32 and images.shape == (8, 3, 32, 32)
    assert -2.2 < images.min() < 0 < images.max() < 2.7  # normalised with ImageNet mean/std on the device
    labels = torch.cat([y for _, y in recorder.batches[:4]])
    assert labels.bincount(minlength=3).sum() == 31
    assert monitor.meter.total().steps == 8  # every step, each epoch's first too
    assert "train_loss" in trainer.callback_metrics and "val_acc" in trainer.callback_metrics
    assert "data_wait_fraction" in trainer.callback_metrics


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_hdf5_fit_end_to_end(image_folder: Path, tmp_path: Path, workers: int) -> None:
    h5 = convert_folder_to_hdf5(image_folder, tmp_path / "d.h5", mode="raw", size=40, processes=1, progress=False)
    dm = HDF5DataModule(str(h5), image_size=32, batch_size=8, num_workers=workers, val_fraction=0.2)
    recorder = Recorder()
    trainer = cpu_trainer(recorder, epochs=1)
    trainer.fit(ImageClassifier(num_classes=dm.num_classes), dm)
    assert dm.num_classes == 3 and [len(y) for _, y in recorder.batches] == [8, 8, 8, 7]
    assert recorder.batches[0][0].dtype == torch.float32 and "val_acc" in trainer.callback_metrics


def test_normalisation_matches_torchvision(image_folder: Path) -> None:
    from torchvision.transforms import Normalize

    dm = ImageFolderDataModule(str(image_folder), image_size=32, num_workers=0)
    x = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    got = dm.on_after_batch_transfer((x, torch.zeros(2)), 0)[0]
    want = Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))(x.float() / 255)
    torch.testing.assert_close(got, want)


def test_val_split_is_seeded_and_disjoint(image_folder: Path) -> None:
    def split(seed: int) -> tuple[set[str], set[str]]:
        dm = ImageFolderDataModule(str(image_folder), val_fraction=0.25, seed=seed, num_workers=0)
        dm.setup("fit")
        tr, va = dm.train_dataset.index, dm.val_dataset.index  # type: ignore[union-attr]
        return {tr.relpath(i) for i in range(len(tr))}, {va.relpath(i) for i in range(len(va))}

    tr, va = split(0)
    assert len(va) == 10 and len(tr) == 29 and not tr & va
    assert split(0) == (tr, va) and split(1) != (tr, va)


def test_val_root(tmp_path: Path, image_folder: Path) -> None:
    val = make_image_folder(tmp_path / "val", num_classes=3, per_class=2, size=(40, 30))
    dm = ImageFolderDataModule(str(image_folder), val_root=str(val), num_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 39 and len(dm.val_dataset) == 6  # type: ignore[arg-type]
    other = make_image_folder(tmp_path / "other", num_classes=2, per_class=1, size=(40, 30))
    mismatched = ImageFolderDataModule(str(image_folder), val_root=str(other))  # nothing read yet
    with pytest.raises(ValueError, match="same class folders"):
        mismatched.setup("fit")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"num_workers": -1}, ValueError, "num_workers=0 to disable"),
        ({"num_workers": "lots"}, ValueError, "'auto'"),
        ({"num_workers": 0, "prefetch_factor": 4}, ValueError, "prefetch_factor"),
        ({"num_workers": 0, "persistent_workers": True}, ValueError, "persistent_workers"),
        ({"val_fraction": 1.0}, ValueError, "val_fraction"),
        ({"image_size": -3}, ValueError, "image_size"),
        ({"std": (0.2, 0.0, 0.2)}, ValueError, "std"),
    ],
)
def test_impossible_arguments_fail_in_init(image_folder: Path, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ImageFolderDataModule(str(image_folder), **kwargs)


def test_a_missing_root_fails_when_first_read_naming_it(tmp_path: Path) -> None:
    dm = ImageFolderDataModule(str(tmp_path / "nope"))  # Lightning's rule: __init__ reads no data
    with pytest.raises(FileNotFoundError, match="nope"):
        dm.num_classes  # noqa: B018 - LightningCLI's link reads it right after __init__: fails before training


@pytest.mark.timeout(240)
def test_skipped_corrupt_images_are_reported_after_the_epoch(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=6, size=(48, 40))
    bad = root / "class_000" / "img_000001.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    dm = ImageFolderDataModule(str(root), image_size=16, batch_size=4, num_workers=0, val_fraction=0, on_corrupt="skip")
    trainer = cpu_trainer(epochs=2)
    with pytest.warns(UserWarning, match=r"Epoch 0: skipped 1 corrupt\b") as record:
        trainer.fit(ImageClassifier(num_classes=2), dm)
    assert any("Epoch 1: skipped 1 corrupt" in str(w.message) for w in record)


def test_workers_stop_at_once_after_a_worker_exception(tmp_path: Path) -> None:
    """torch's ExceptionWrapper.reraise leaves a plain DataLoader iterator in a reference cycle; freed by the garbage
    collector, each worker then misses its shutdown message and is joined after 5 s (10 s for 2 workers)."""
    root = make_image_folder(tmp_path / "d", num_classes=2, per_class=6, size=(48, 40))
    bad = root / "class_001" / "img_000002.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated: on_corrupt="raise" fails in a worker
    dm = ImageFolderDataModule(str(root), image_size=16, batch_size=2, num_workers=2, val_fraction=0, shuffle=False)
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    with pytest.raises(OSError, match="img_000002.jpg"):
        for _ in range(10):
            next(it)
    ref = weakref.ref(it)
    start = time.perf_counter()
    del it
    gc.collect()
    assert ref() is None
    assert time.perf_counter() - start < 4.0  # both workers told to stop, not joined after timeouts


@pytest.mark.parametrize("kind", ["folder", "model"])
def test_modules_are_freed_by_reference_count_and_their_workers_stop_at_once(image_folder: Path, kind: str) -> None:
    """Lightning's save_hyperparameters left a frame cycle: a dropped DataModule waited for the garbage collector,
    which finalised its loader's queues first, so each persistent worker was joined only after a 5 s timeout."""
    gc.disable()
    try:
        if kind == "model":
            model = ImageClassifier(num_classes=3, arch="resnet18")
            ref = weakref.ref(model)
            del model
            assert ref() is None
            return
        dm = ImageFolderDataModule(
            str(image_folder), image_size=16, batch_size=8, num_workers=2, persistent_workers=True, val_fraction=0
        )
        dm.setup("fit")
        for _ in dm.train_dataloader():
            pass
        ref = weakref.ref(dm)
        start = time.perf_counter()
        del dm
        assert ref() is None  # freed now, not at the next collection
        assert time.perf_counter() - start < 4.0  # workers told to stop, not joined after a timeout
    finally:
        gc.enable()


@pytest.mark.timeout(120)
def test_exact_decode_reaches_the_workers_and_gives_the_full_decode_pixels(
    image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # exact_decode=True through 2 worker processes and the ROI decoder == torchvision's full decode_jpeg of each
    # image (the decoder used without the compiled extension), same crops: bit for bit
    from lightning_fastdata.loading.jpeg import decode

    def first_batch(workers: int, **kw: Any) -> torch.Tensor:
        dm = ImageFolderDataModule(
            str(image_folder), image_size=32, batch_size=16, num_workers=workers, val_fraction=0.0, **kw
        )
        dm.setup("fit")
        return next(iter(dm.train_dataloader()))[0]

    assert decode.roi_decode_available()
    exact = first_batch(2, exact_decode=True)
    default = first_batch(2)
    monkeypatch.setattr(decode, "_jpegroi", None)
    reference = first_batch(0, exact_decode=True)
    assert torch.equal(exact, reference)
    assert not torch.equal(default, reference) and (default.float() - reference.float()).abs().mean() < 2.0


def test_a_segmentation_dataset_is_not_a_folder_of_classes(tmp_path: Path, s3: LocalS3) -> None:
    """ADE20K's ``images``/``annotations`` would be two classes (photo, mask) to a classification module: refused,
    naming the layout and the module that reads it, locally and from a bucket; so is the converter."""
    from benchmarks.s3_server import upload_folder
    from lightning_fastdata import convert_folder_to_hdf5
    from lightning_fastdata.segmentation.demos import make_segmentation_folder

    root = make_segmentation_folder(tmp_path / "ade", count=4, size=(64, 48), layout="ade20k")
    url = s3.url(f"ade-{tmp_path.name}")
    upload_folder(root, url, s3.storage_options())
    message = r"holds annotations, images: a segmentation dataset \(ADE20K or paired layout.*SegmentationDataModule"
    for where, options in ((str(root), None), (url, s3.storage_options())):
        with pytest.raises(ValueError, match=message):
            ImageFolderDataModule(where, storage_options=options, num_workers=0).setup("fit")
    with pytest.raises(ValueError, match=message):
        convert_folder_to_hdf5(root, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("kind", ["folder", "cache", "hdf5", "tar", "parquet", "segmentation", "mixed"])
def test_init_reads_no_data_and_setup_finds_what_was_written_after_it(tmp_path: Path, kind: str) -> None:
    """Lightning's rule: a DataModule's ``__init__`` reads no data (the Trainer lists, downloads and indexes in
    ``prepare_data``/``setup``). Each module is made before its data exists, then the data is written: ``setup`` finds
    it, with its classes, so nothing was listed, opened or indexed when the module was made."""
    from lightning_fastdata import (
        HDF5DataModule,
        MixedDataModule,
        SegmentationDataModule,
        ShardDataModule,
        TensorCacheDataModule,
    )
    from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards
    from lightning_fastdata.segmentation.demos import make_segmentation_folder

    data, idx = tmp_path / "data", str(tmp_path / "idx")
    kw: dict[str, Any] = dict(image_size=16, batch_size=4, num_workers=0, val_fraction=0.25)
    modules = {
        "folder": lambda: ImageFolderDataModule(str(data), **kw),
        "cache": lambda: TensorCacheDataModule(str(data), str(tmp_path / "cache"), cache_size=20, **kw),
        "hdf5": lambda: HDF5DataModule(str(tmp_path / "d.h5"), **kw),
        "tar": lambda: ShardDataModule(str(tmp_path / "tar"), index_dir=idx, **kw),
        "parquet": lambda: ShardDataModule(str(tmp_path / "pq"), index_dir=idx, **kw),
        "segmentation": lambda: SegmentationDataModule(
            str(data), base_size=24, crop_size=16, batch_size=4, num_workers=0, index_dir=idx
        ),
        "mixed": lambda: MixedDataModule(
            [ImageFolderDataModule(str(data), **kw), HDF5DataModule(str(tmp_path / "d.h5"), **kw)], **kw
        ),
    }
    dm = modules[kind]()  # nothing exists yet
    if kind == "segmentation":
        make_segmentation_folder(data, count=8, size=(48, 36), seed=1)  # VOC's layout: 21 classes
    else:
        make_image_folder(data, num_classes=3, per_class=4, size=(32, 24))
    if kind in ("hdf5", "mixed"):
        convert_folder_to_hdf5(data, tmp_path / "d.h5", processes=1, progress=False)
    if kind == "tar":
        write_tar_shards(data, tmp_path / "tar", shard_bytes=20_000)
    if kind == "parquet":
        write_parquet_shards(data, tmp_path / "pq", shard_bytes=20_000, rows_per_group=4)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_classes == (21 if kind == "segmentation" else 3)
    assert len(dm.train_dataset) > 0 and next(iter(dm.train_dataloader()))[0].shape[0] == 4  # type: ignore[arg-type]
