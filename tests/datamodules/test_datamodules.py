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
    with pytest.raises(ValueError, match="same class folders"):
        ImageFolderDataModule(str(image_folder), val_root=str(other))


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


def test_missing_root_fails_in_init(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        ImageFolderDataModule(str(tmp_path / "nope"))


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
