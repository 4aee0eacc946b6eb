from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from lightning_fastdata import (
    EpochSampler,
    HDF5DataModule,
    HDF5Dataset,
    ImageFolderDataset,
    convert_folder_to_hdf5,
    inspect_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available
from lightning_fastdata.loading.transport.collate import collate_prebatched

KEYS = [(1, i) for i in range(39)]


@pytest.fixture(scope="module")
def encoded(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_folder_to_hdf5(image_folder, tmp_path_factory.mktemp("h5") / "enc.h5", processes=2, progress=False)


@pytest.fixture(scope="module")
def raw(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("h5") / "raw.h5"
    return convert_folder_to_hdf5(image_folder, dst, mode="raw", size=48, processes=2, progress=False)


def batches(ds: HDF5Dataset | ImageFolderDataset, workers: int, context: str | None = None) -> list:
    sampler = EpochSampler(len(ds), seed=5)
    sampler.set_epoch(2)
    loader = DataLoader(
        ds,
        batch_size=8,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_prebatched,
        multiprocessing_context=context if workers else None,
    )
    return list(loader)


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_encoded_round_trip_equals_the_folder_decode(encoded: Path, image_folder: Path) -> None:
    folder = ImageFolderDataset(str(image_folder), image_size=32, seed=3)
    h5 = HDF5Dataset(str(encoded), image_size=32, seed=3)
    assert h5.classes == folder.classes and np.array_equal(h5.targets, folder.targets)
    assert h5.layout.kind == "encoded" and h5.layout.mmap_offset is not None  # memory-mapped read path
    for train in (True, False):
        folder.train = h5.train = train
        a, b = folder.__getitems__(KEYS), h5.__getitems__(KEYS)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_raw_file_holds_the_central_square_resized(raw: Path, image_folder: Path) -> None:
    ref = ImageFolderDataset(str(image_folder), train=False, image_size=48, crop_fraction=1.0)
    with h5py.File(raw) as f:
        stored = torch.from_numpy(f["images"][()]).permute(0, 3, 1, 2)
        assert f.attrs["mode"] == "raw" and json.loads(f.attrs["classes"]) == list(ref.classes)
        assert f["images"].chunks is None and f["images"].compression is None
    assert torch.equal(stored, ref.__getitems__(list(range(39)))[0])
    ds = HDF5Dataset(str(raw), image_size=32)
    x, y = ds.__getitems__(KEYS)
    assert x.shape == (39, 3, 32, 32) and x.dtype == torch.uint8 and torch.equal(y, torch.from_numpy(ref.targets))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2, 4])
@pytest.mark.parametrize("kind", ["encoded", "raw"])
def test_workers_give_exactly_the_expected_samples(kind: str, workers: int, encoded: Path, raw: Path) -> None:
    ds = HDF5Dataset(str(encoded if kind == "encoded" else raw), image_size=24)
    expected = batches(ds, 0)
    got = batches(ds, workers)
    assert_same(expected, got)
    assert sorted(torch.cat([y for _, y in got]).tolist()) == sorted(ds.targets.tolist())


@pytest.mark.timeout(180)
# spawn: 7 s on the 2-core VM (its workers import torch), so in the full run only
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_opened_before_workers_start_is_handled(raw: Path, context: str) -> None:
    """The naive pattern: the file is read (opened) in the main process before the workers start."""
    ds = HDF5Dataset(str(raw), image_size=24)
    first = ds[(0, 0)]
    assert ds._pid == os.getpid() and ds._images is not None  # opened here
    assert len(pickle.dumps(ds)) < 20_000  # the open map/handle is not pickled
    assert_same(batches(ds, 0), batches(ds, 2, context))
    assert torch.equal(ds[(0, 0)][0], first[0])


def test_a_setup_opens_the_file_once_for_both_splits(encoded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dm = HDF5DataModule(str(encoded), image_size=16, batch_size=4, num_workers=0, val_fraction=0.25)
    opened: list[str] = []
    real = h5py.File
    monkeypatch.setattr(h5py, "File", lambda name, *a, **k: opened.append(str(name)) or real(name, *a, **k))
    dm.setup("fit")
    assert opened == [str(encoded)]  # one inspection (offsets included) serves the train and the val dataset
    assert len(dm.train_dataset) + len(dm.val_dataset) == 39  # type: ignore[arg-type]
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 16, 16) and opened == [str(encoded)]  # the reader maps the file: no h5py open


def write_user_file(path: Path, images: np.ndarray, labels: np.ndarray, **create: object) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=images, **create)
        f.create_dataset("y", data=labels)
    return path


def test_user_files_chunked_compressed_and_float(raw: Path, tmp_path: Path) -> None:
    with h5py.File(raw) as f:
        hwc, labels = f["images"][()], f["labels"][()]
    reference = HDF5Dataset(str(raw), image_size=24, train=False)
    expect, _ = reference.__getitems__(list(range(39)))
    chunked = write_user_file(tmp_path / "c.h5", hwc, labels, chunks=(5, 48, 48, 3), compression="gzip")
    ds = HDF5Dataset(str(chunked), image_size=24, train=False, images_key="x", labels_key="y")
    assert ds.layout.kind == "hwc" and ds.layout.chunk_rows == 5 and ds.layout.mmap_offset is None
    got, y = ds.__getitems__([38, 0, 17, 5, 6])  # unsorted, spread over chunks
    assert torch.equal(got, expect[[38, 0, 17, 5, 6]]) and y.tolist() == labels[[38, 0, 17, 5, 6]].tolist()
    # the seed-style file: float32 N x 3 x H x W, written by the user
    chw = write_user_file(tmp_path / "f.h5", hwc.transpose(0, 3, 1, 2).astype(np.float32) / 255, labels)
    fds = HDF5Dataset(str(chw), image_size=24, train=False, images_key="x", labels_key="y")
    fx, _ = fds.__getitems__(list(range(39)))
    assert fds.layout.kind == "chw" and fx.dtype == torch.float32
    assert (fx * 255 - expect.float()).abs().mean() < 1.0


def test_vlen_encoded_user_file(encoded: Path, tmp_path: Path) -> None:
    with h5py.File(encoded) as f:
        blob, offsets, labels = f["images"][()], f["offsets"][()], f["labels"][()]
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("images", shape=(len(labels),), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(len(labels)):
            ds[i] = blob[offsets[i] : offsets[i + 1]]
        f.create_dataset("labels", data=labels)
    a = HDF5Dataset(str(path), image_size=24).__getitems__(KEYS)
    b = HDF5Dataset(str(encoded), image_size=24).__getitems__(KEYS)
    assert HDF5Dataset(str(path)).layout.vlen and torch.equal(a[0], b[0])


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_killed_conversion_leaves_nothing_at_dst_and_rerun_recovers(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "src", num_classes=2, per_class=200, size=(320, 240), processes=2)
    dst = tmp_path / "out" / "big.h5"
    code = (
        "import sys; from lightning_fastdata import convert_folder_to_hdf5; "
        f"convert_folder_to_hdf5({str(src)!r}, {str(dst)!r}, mode='raw', size=128, processes=1, progress=False)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 60
    while not list(dst.parent.glob(".big.h5.*.tmp")) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists(), "a killed conversion must not leave a file at dst"
    assert list(dst.parent.glob(".big.h5.*.tmp"))  # the half-written temporary is only under a hidden name
    convert_folder_to_hdf5(src, dst, mode="raw", size=32, processes=2, progress=False)
    assert len(inspect_hdf5(str(dst)).labels) == 400
    assert not list(dst.parent.glob(".big.h5.*.tmp"))  # the dead run's temporary was cleaned up


def test_corrupt_source_image_fails_the_conversion(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "src", num_classes=2, per_class=3, size=(40, 30))
    bad = src / "class_001" / "img_000001.jpg"
    bad.write_bytes(bad.read_bytes()[:150])
    with pytest.raises(OSError, match="img_000001.jpg"):
        convert_folder_to_hdf5(src, tmp_path / "o.h5", processes=1, progress=False)
    assert not (tmp_path / "o.h5").exists()
    with pytest.raises(FileExistsError, match="overwrite"):
        (tmp_path / "exists.h5").write_bytes(b"")
        convert_folder_to_hdf5(src, tmp_path / "exists.h5", progress=False)


def test_corrupt_encoded_image_names_the_row(encoded: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    path.write_bytes(encoded.read_bytes())
    with h5py.File(path, "r+") as f:
        o = f["offsets"][()]
        f["images"][o[7] : o[8]] = np.zeros(o[8] - o[7], dtype=np.uint8)
    ds = HDF5Dataset(str(path), image_size=16)
    with pytest.raises(OSError, match=r"bad\.h5\['images'\]\[7\]"):
        ds.__getitems__(list(range(10)))
    skipping = HDF5Dataset(str(path), image_size=16, on_corrupt="skip")
    assert len(skipping.__getitems__(list(range(10)))[1]) == 9 and skipping.skipped_count() == 1


def bad_file(tmp_path: Path, case: str) -> tuple[Path, dict]:
    path = tmp_path / f"{case}.h5"
    imgs = np.zeros((4, 8, 8, 3), np.uint8)
    kw: dict = {}
    with h5py.File(path, "w") as f:
        if case == "missing_key":
            f["images"] = imgs
        elif case == "length":
            f["images"], f["labels"] = imgs, np.zeros(5, np.int64)
        elif case == "label_dtype":
            f["images"], f["labels"] = imgs, np.zeros(4, np.float32)
        elif case == "label_shape":  # neither one label per sample nor multi-hot rows (N x C)
            f["images"], f["labels"] = imgs, np.zeros((4, 2, 2), np.int64)
        elif case == "multi_hot_values":  # multi-hot rows take 0 or 1
            f["images"], f["labels"] = imgs, np.array([[0, 1], [1, 0], [2, 0], [0, 0]], np.int64)
        elif case == "rank":
            f["images"], f["labels"] = np.zeros((4, 8, 8), np.uint8), np.zeros(4, np.int64)
        elif case == "range":
            f["images"], f["labels"] = imgs, np.array([0, 1, 2, 3])
            f.attrs["classes"] = json.dumps(["a", "b"])
        elif case == "negative":
            f["images"], f["labels"] = imgs, np.array([0, -1, 0, 0])
        elif case == "version":
            f["images"], f["labels"] = imgs, np.zeros(4, np.int64)
            f.attrs["fastdata_format"] = 99
        elif case == "dtype":
            f["images"], f["labels"] = imgs.astype(np.int32), np.zeros(4, np.int64)
    return path, kw


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing_key", r"no dataset 'labels'.*labels_key="),
        ("length", r"4 images but 5 labels"),
        ("label_dtype", r"one integer label per sample.*dtype float32"),
        ("label_shape", r"one integer label per sample.*multi-hot rows.*shape \(4, 2, 2\)"),
        ("multi_hot_values", r"multi-hot rows.*take 0 or 1.*\[2, 0\] = 2"),
        ("rank", r"Cannot tell the layout.*layout="),
        ("range", r"\['labels'\]\[2\] = 2 is out of range \[0, 2\)"),
        ("negative", r"\['labels'\]\[1\] = -1"),
        ("version", r"fastdata_format=99.*upgrade"),
        ("dtype", r"dtype int32; expected uint8 or float"),
    ],
)
def test_bad_files_raise_naming_file_and_key(tmp_path: Path, case: str, match: str) -> None:
    path, kw = bad_file(tmp_path, case)
    with pytest.raises(ValueError, match=match) as info:
        HDF5Dataset(str(path), **kw)
    assert str(path) in str(info.value)


def test_not_hdf5_and_missing(tmp_path: Path) -> None:
    (tmp_path / "a.h5").write_text("hello")
    with pytest.raises(ValueError, match="not an HDF5 file.*fastdata convert"):
        HDF5DataModule(str(tmp_path / "a.h5")).setup("fit")  # read when first needed, never in __init__
    with pytest.raises(FileNotFoundError, match="nope.h5"):
        HDF5DataModule(str(tmp_path / "nope.h5")).num_classes  # noqa: B018 - what LightningCLI's link reads


def test_reencoded_compact_file_is_smaller_same_samples_and_trains(image_folder: Path, tmp_path: Path) -> None:
    """--max-side: each image re-encoded once (shorter side <= max_side), same files, order and labels."""
    plain = convert_folder_to_hdf5(image_folder, tmp_path / "plain.h5", processes=1, progress=False)
    compact = convert_folder_to_hdf5(
        image_folder, tmp_path / "c.h5", max_side=40, quality=85, processes=2, progress=False
    )
    assert compact.stat().st_size < 0.8 * plain.stat().st_size
    ref = ImageFolderDataset(str(image_folder), image_size=32)
    ds = HDF5Dataset(str(compact), image_size=32, seed=3)
    assert ds.classes == ref.classes and np.array_equal(ds.targets, ref.targets)
    with h5py.File(compact) as f:
        assert f.attrs["max_side"] == 40 and f.attrs["quality"] == 85
        offsets, blob = f["offsets"][()], f["images"]
        for i in (0, 17, 38):
            with Image.open(io.BytesIO(blob[offsets[i] : offsets[i + 1]].tobytes())) as img:
                original = Image.open(ref.index.path(i))
                assert img.format == "JPEG" and min(img.size) == 40  # 96x72 sources: shorter side 72 -> 40
                assert abs(img.size[0] / img.size[1] - original.size[0] / original.size[1]) < 0.05
    images, labels = ds.__getitems__(KEYS)
    assert images.shape == (39, 3, 32, 32) and labels.tolist() == ref.targets.tolist()
    assert not list(tmp_path.glob(".*"))  # no temporary or side file left


def test_reencode_rejects_impossible_arguments_and_names_corrupt_files(image_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_side"):
        convert_folder_to_hdf5(image_folder, tmp_path / "x.h5", mode="raw", max_side=64, progress=False)
    with pytest.raises(ValueError, match="quality"):
        convert_folder_to_hdf5(image_folder, tmp_path / "x.h5", max_side=64, quality=0, progress=False)
    bad = make_image_folder(tmp_path / "bad", num_classes=2, per_class=2, size=(32, 24))
    victim = next(bad.glob("class_001/*.jpg"))
    victim.write_bytes(victim.read_bytes()[:200])
    with pytest.raises(OSError, match=victim.name):
        convert_folder_to_hdf5(bad, tmp_path / "bad.h5", max_side=16, processes=1, progress=False)
    assert not (tmp_path / "bad.h5").exists() and not list(tmp_path.glob(".bad.h5*"))


def _counting_crops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the crops decoded through the entropy index in this process (``crop_jpeg`` calls that built one)."""
    from lightning_fastdata.loading.jpeg import decode

    calls = [0]
    real = decode._jpegroi

    class Counting:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def crop_jpeg(self, *args: object) -> bytes | None:
            small = real.crop_jpeg(*args)
            calls[0] += small is not None
            return small

    monkeypatch.setattr(decode, "_jpegroi", Counting())
    return calls


@pytest.mark.skipif(not entropy_index_available(), reason="needs the compiled JPEG decoder")
def test_encoded_files_keep_each_images_entropy_index_and_crops_decode_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converter stores every image's entropy index in the file; the dataset decodes training crops with it:
    the same batches as without it (through worker processes), most crops through it; an image it cannot serve
    (a PNG) has an empty entry."""
    from lightning_fastdata.loading.jpeg.entropy_index import FORMAT, INDEX_FRACTION, index_file

    root = make_image_folder(tmp_path / "src", num_classes=2, per_class=6, size=(320, 240))
    Image.new("RGB", (40, 30), (1, 2, 3)).save(root / "class_001" / "flat.png")
    for compact in (False, True):  # the original bytes, and re-encoded (what the jpeg tensor cache stores)
        dst = convert_folder_to_hdf5(
            root, tmp_path / f"{compact}.h5", processes=2, progress=False, max_side=200 if compact else None
        )
        with h5py.File(dst) as f:
            assert f.attrs["entropy_index_format"] == FORMAT
            offsets, blob = f["offsets"][()], f["images"][()]
            index_offsets, indexes = f["entropy_index_offsets"][()], f["entropy_index"][()]
        entries = [indexes[index_offsets[i] : index_offsets[i + 1]].tobytes() for i in range(13)]
        images = [blob[offsets[i] : offsets[i + 1]].tobytes() for i in range(13)]
        assert entries == [index_file(data, "x") for data in images]
        assert sum(e == b"" for e in entries) == (0 if compact else 1)  # the PNG (re-encoded as a JPEG if compact)
        assert len(indexes) <= INDEX_FRACTION * len(blob)
        on, off = (HDF5Dataset(str(dst), image_size=64, seed=3, entropy_index=e) for e in (True, False))
        assert on.use_entropy_index and not off.use_entropy_index
        assert_same(batches(off, 0), batches(on, 2))
        calls = _counting_crops(monkeypatch)
        keys = [(1, i) for i in range(13)] * 4
        assert torch.equal(on.__getitems__(keys)[0], off.__getitems__(keys)[0])
        assert calls[0] >= 20, f"only {calls[0]} of 52 crops went through the index"
        monkeypatch.undo()


@pytest.mark.skipif(not entropy_index_available(), reason="needs the compiled JPEG decoder")
def test_the_jpeg_tensor_cache_trains_with_its_entropy_index(tmp_path: Path) -> None:
    from lightning_fastdata import TensorCacheDataModule

    root = make_image_folder(tmp_path / "src", num_classes=2, per_class=8, size=(320, 240))
    common = dict(image_size=48, batch_size=4, num_workers=2, val_fraction=0.0, seed=2, cache_size=160)
    dm = TensorCacheDataModule(str(root), str(tmp_path / "cache"), storage="jpeg", **common)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.train_dataset.use_entropy_index
    with h5py.File(tmp_path / "cache" / "train.h5") as f:
        assert len(f["entropy_index_offsets"]) == 17 and f["entropy_index"].shape[0] > 0
    with_index = list(dm.train_dataloader())
    dm.train_dataset.use_entropy_index = False
    without = list(dm.train_dataloader())
    assert_same(without, with_index)


@pytest.mark.timeout(120)
def test_a_pcam_layout_file_trains_and_tests_through_workers(tmp_path: Path) -> None:
    """PCam's layout: ``x`` N x 96 x 96 x 3 uint8, ``y`` N x 1 x 1 x 1 (labels with trailing size-1 dimensions):
    read as N labels, through two worker processes, for training and ``trainer.test``."""
    import lightning_fastdata
    from lightning_fastdata.testing import cpu_trainer

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=(24, 1, 1, 1)).astype(np.uint8)
    for name in ("train", "test"):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["x"] = rng.integers(0, 256, size=(24, 96, 96, 3), dtype=np.uint8)
            f["y"] = labels
    dm = HDF5DataModule(
        str(tmp_path / "train.h5"),
        test_root=str(tmp_path / "test.h5"),
        images_key="x",
        labels_key="y",
        image_size=32,
        batch_size=5,
        num_workers=2,
        val_fraction=0,
    )
    assert dm.num_classes == 2
    seen: list[int] = []

    class Labels(lightning_fastdata.ImageClassifier):
        def test_step(self, batch: Any, batch_idx: int) -> None:
            seen.extend(batch[1].tolist())
            super().test_step(batch, batch_idx)

    model = Labels(num_classes=2)
    trainer = cpu_trainer(max_steps=2)
    trainer.fit(model, dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert sorted(seen) == sorted(labels.reshape(-1).tolist()) and len(seen) == 24
    assert {"test_loss", "test_acc"} <= result.keys()


@pytest.mark.parametrize("size", [(128, 96), [64, 64], 0, True])
def test_image_size_is_one_positive_int_on_every_module(tmp_path: Path, size: Any) -> None:
    """A (height, width) image_size is refused with the reason (square outputs) and what to do, not a TypeError."""
    root = make_image_folder(tmp_path / "d", num_classes=2, per_class=2, size=(32, 24))
    h5 = convert_folder_to_hdf5(root, tmp_path / "d.h5", processes=1, progress=False)
    match = "outputs are squares" if isinstance(size, (tuple, list)) else "image_size should be a positive int"
    from lightning_fastdata import ImageFolderDataModule, TensorCacheDataModule

    for make in (
        lambda: ImageFolderDataModule(str(root), image_size=size),
        lambda: HDF5DataModule(str(h5), image_size=size),
        lambda: TensorCacheDataModule(str(root), str(tmp_path / "cache"), image_size=size),
    ):
        with pytest.raises(ValueError, match=match):
            make()
