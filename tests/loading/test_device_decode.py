"""``decode_on="device"``: the workers plan (header, crop, flip, bytes), the device decodes.

On the CPU the device half runs with torchvision's host decoder (``decode_jpeg(device="cpu")``, libjpeg-turbo's exact
IDCT) in place of nvJPEG: the same code path, so its pixels must be the workers' exact path's (``exact_decode=True``)
to within the resize's rounding. ``tests/test_cuda.py`` runs nvJPEG itself where a GPU is.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from lightning_fastdata import (
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    MixedDataModule,
    SegmentationDataModule,
    ShardDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.augment import TrivialAugmentWide
from lightning_fastdata.callbacks.limit import RunFacts, run_verdict
from lightning_fastdata.callbacks.monitor import could_decode_on_device
from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards
from lightning_fastdata.datasets.base import LoaderPlan
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.demos import make_image_folder, photo_like_image
from lightning_fastdata.errors import CorruptImageError
from lightning_fastdata.loading.batch import DeviceBatch, EncodedBatch, PredictBatch
from lightning_fastdata.loading.jpeg.device import decode_encoded

#: One grey level after normalisation (the smallest std of ImageNet's), plus float slack.
ONE_LEVEL = 1.0 / 255 / 0.225 + 1e-4


def module(root: Path | str, **kwargs: object) -> ImageFolderDataModule:
    settings: dict[str, object] = dict(
        image_size=40, batch_size=8, num_workers=2, val_fraction=0.25, entropy_index=False, seed=3
    )
    return ImageFolderDataModule(str(root), **{**settings, **kwargs})


def on_device(dm: ImageFolderDataModule, loader: object, limit: int = 99) -> list[tuple[type, object]]:
    """What the training step gets: each batch moved (to the CPU here) and through the device hook."""
    out = []
    for i, batch in enumerate(loader):  # type: ignore[attr-defined]
        if i == limit:
            break
        moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
        out.append((type(batch), dm.on_after_batch_transfer(moved, 0)))
    return out


def assert_same_batches(ours: list[tuple[type, object]], reference: list[tuple[type, object]]) -> None:
    assert len(ours) == len(reference) > 0
    for (kind, (images, labels)), (_, (ref_images, ref_labels)) in zip(ours, reference):  # type: ignore[misc]
        assert kind is EncodedBatch
        assert images.shape == ref_images.shape and images.dtype == torch.float32
        assert torch.equal(labels, ref_labels)
        assert (images - ref_images).abs().max() <= ONE_LEVEL  # the same crop and flip, one IDCT: rounding apart


def test_batches_decoded_on_the_device_are_the_workers_exact_batches_through_two_workers(image_folder: Path) -> None:
    reference, ours = module(image_folder, exact_decode=True), module(image_folder, decode_on="device")
    reference.setup("fit")
    ours.setup("fit")
    for split in ("train_dataloader", "val_dataloader"):
        assert_same_batches(on_device(ours, getattr(ours, split)()), on_device(reference, getattr(reference, split)()))


def test_device_policies_draw_from_the_keys_the_encoded_batch_carries(image_folder: Path) -> None:
    """With device_transforms the decoded batch is a DeviceBatch with its keys: the policy runs as on any batch."""
    reference = module(image_folder, exact_decode=True, device_transforms=TrivialAugmentWide(), num_workers=0)
    ours = module(image_folder, decode_on="device", device_transforms=TrivialAugmentWide(), num_workers=0)
    for dm in (reference, ours):
        dm.setup("fit")
    batch = next(iter(ours.train_dataloader()))
    assert isinstance(batch, EncodedBatch) and batch.keys is not None and batch.keys.shape == (8, 3)
    decoded = ours.transfer._decoded(batch, None)
    assert isinstance(decoded, DeviceBatch) and torch.equal(decoded.keys, batch.keys)
    ref = next(iter(reference.train_dataloader()))
    assert torch.equal(ref.keys, batch.keys)
    # the uint8 crops before the policy: one grey level apart at most
    assert (decoded.images.int() - ref.images.int()).abs().max() <= 1
    images, _ = ours.on_after_batch_transfer(batch, 0)
    ref_images, _ = reference.on_after_batch_transfer(ref, 0)
    assert (
        images.shape == ref_images.shape == (8, 3, 40, 40)
    )  # the policy ran (its pixels may move more than one level)


def test_formats_nvjpeg_cannot_take_are_decoded_by_the_workers(tmp_path: Path) -> None:
    """PNG and CMYK JPEG: rendered in the workers and carried as pixels; grayscale JPEG: decoded on the device."""
    root = tmp_path / "train"
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            photo_like_image(rng, 90, 70, hue=0.2).save(root / c / f"rgb{i}.jpg", quality=90)
        photo_like_image(rng, 90, 70, hue=0.5).save(root / c / "lossless.png")
        photo_like_image(rng, 90, 70, hue=0.7).convert("L").save(root / c / "grey.jpg", quality=90)
        photo_like_image(rng, 90, 70, hue=0.9).convert("CMYK").save(root / c / "print.jpg", quality=90)
    ours = ImageFolderDataset(str(root), image_size=32, exact_decode=True).for_loader(LoaderPlan(decode_on_device=True))
    reference = ImageFolderDataset(str(root), image_size=32, exact_decode=True)
    keys = [(0, i, 0) for i in range(len(reference))]
    batch = ours.__getitems__(keys)
    names = [Path(n).name for n in batch.names]
    rendered = sorted(names[i] for i in batch.rendered_rows.tolist())
    assert rendered == ["lossless.png", "lossless.png", "print.jpg", "print.jpg"]
    images, kept = decode_encoded(batch)
    ref_images, ref_labels = reference.__getitems__(keys)
    assert kept.all() and torch.equal(batch.labels, ref_labels)
    assert (images.int() - ref_images.int()).abs().max() <= 1


def corrupt_folder(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A folder with a JPEG cut in half (a readable header) and one with no readable header."""
    root = make_image_folder(tmp_path / "train", num_classes=2, per_class=5, size=(80, 60))
    buf = io.BytesIO()
    photo_like_image(np.random.default_rng(5), 80, 60, hue=0.1).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    cut, headless = root / "class_000" / "cut.jpg", root / "class_001" / "headless.jpg"
    cut.write_bytes(data[: len(data) // 2])
    headless.write_bytes(data[:40])
    return root, cut, headless


def test_corrupt_images_are_named_and_skipped_on_either_side_as_on_corrupt_says(tmp_path: Path) -> None:
    root, cut, headless = corrupt_folder(tmp_path)
    dm = module(root, decode_on="device", on_corrupt="skip", max_corrupt_fraction=0.5, shuffle=False, val_fraction=0)
    dm.setup("fit")
    seen = sum(len(labels) for _, (_, labels) in on_device(dm, dm.train_dataloader()))  # type: ignore[misc]
    assert seen == 12 - 2  # the headless one skipped by its worker, the cut one on the device
    assert dm.train_dataset.skipped_count() == 2  # type: ignore[union-attr]

    # on_corrupt="raise" (the default): the file named, by the worker (its header) or by the device hook (its data)
    dm = module(root, decode_on="device", val_fraction=0, num_workers=0)
    dm.setup("fit")
    dataset = dm.train_dataset.for_loader(LoaderPlan(decode_on_device=True))  # type: ignore[union-attr]
    everything = [(0, i, 0) for i in range(len(dataset))]
    with pytest.raises(CorruptImageError, match="headless.jpg.: unreadable JPEG header"):
        dataset.__getitems__(everything)
    batch = dataset.__getitems__([k for k in everything if dataset.describe(k[1]) != str(headless)])
    assert str(cut) in batch.names and len(batch.names) == 11
    with pytest.raises(CorruptImageError, match="cut.jpg.: (Image is incomplete or truncated|.*premature end)"):
        dm.on_after_batch_transfer(batch, 0)


def test_a_mix_and_predict_decode_on_the_device_as_the_workers_would(image_folder: Path, tmp_path: Path) -> None:
    other = make_image_folder(tmp_path / "other", num_classes=2, per_class=6, size=(70, 90))
    mixes = [  # the reference's sources decode with the exact IDCT in their workers
        MixedDataModule([module(image_folder, exact_decode=True), module(other, exact_decode=True)], batch_size=8,
                        num_workers=2, seed=1),
        MixedDataModule([module(image_folder), module(other)], batch_size=8, num_workers=2, seed=1, decode_on="device"),
    ]  # fmt: skip
    for dm in mixes:
        dm.setup("fit")
    assert_same_batches(
        on_device(mixes[1], mixes[1].train_dataloader()), on_device(mixes[0], mixes[0].train_dataloader())
    )

    predicts = [
        module(image_folder, predict_root=str(other), exact_decode=True),
        module(image_folder, predict_root=str(other), decode_on="device"),
    ]
    batches = []
    for dm in predicts:
        dm.setup("predict")
        batches.append(on_device(dm, dm.predict_dataloader()))
    for (_, ref), (kind, got) in zip(*batches):
        assert kind is EncodedBatch and isinstance(got, PredictBatch) and isinstance(ref, PredictBatch)
        assert torch.equal(got.indices, ref.indices) and (got.images - ref.images).abs().max() <= ONE_LEVEL
    assert sum(len(b.indices) for _, b in batches[1]) == 12  # type: ignore[union-attr]


def test_a_resumed_loader_sends_the_same_encoded_batches(image_folder: Path) -> None:
    first = module(image_folder, decode_on="device")
    first.setup("fit")
    loader = first.train_dataloader()
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    expected = next(it)
    second = module(image_folder, decode_on="device")
    second.setup("fit")
    resumed = second.train_dataloader()
    resumed.load_state_dict(state)
    got = next(iter(resumed))
    assert isinstance(got, EncodedBatch)
    for name in ("data", "offsets", "boxes", "flips", "labels", "indices"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_a_bucket_is_read_for_the_device_decode(s3_image_folder: str, image_folder: Path, s3: object) -> None:
    options = s3.storage_options()  # type: ignore[attr-defined]
    local = module(image_folder, decode_on="device")
    remote = module(s3_image_folder, decode_on="device", storage_options=options)
    for dm in (local, remote):
        dm.setup("fit")
    a, b = next(iter(local.train_dataloader())), next(iter(remote.train_dataloader()))
    assert isinstance(b, EncodedBatch) and torch.equal(a.data, b.data) and torch.equal(a.boxes, b.boxes)


def test_decode_on_device_is_refused_where_it_cannot_run(image_folder: Path) -> None:
    dm = module(image_folder, decode_on="device", num_workers=0)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    with pytest.raises(ValueError, match="decode_on='device' decodes JPEGs with nvJPEG on a CUDA GPU; .* on 'cpu'"):
        trainer.fit(ImageClassifier(num_classes=3, arch="resnet18"), datamodule=dm)
    with pytest.raises(ValueError, match="train_transforms .*device_transforms"):
        module(image_folder, decode_on="device", train_transforms=lambda x: x)
    with pytest.raises(ValueError, match="decode_on should be 'workers' or 'device', got 'gpu'"):
        module(image_folder, decode_on="gpu")


def test_the_monitor_names_the_device_decode_where_the_workers_decode_is_the_limit(image_folder: Path) -> None:
    facts = dict(steps=100, wall_s=10.0, wait_s=6.0, workers=4, workers_cpu_s=39.0, accelerator=True)
    said = run_verdict(RunFacts(**facts, device_decode=True))  # type: ignore[arg-type]
    assert said.limit == "decode" and "decode_on='device'" in said.message
    assert "decode_on" not in run_verdict(RunFacts(**facts)).message  # type: ignore[arg-type]

    # the monitor offers it for a module that decodes JPEGs in its workers, on a CUDA Trainer (a stand-in here)
    def trainer(dm: object, device: str) -> SimpleNamespace:
        return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), datamodule=dm)

    folder, on_gpu = module(image_folder), module(image_folder, decode_on="device")
    assert could_decode_on_device(trainer(folder, "cuda"))  # type: ignore[arg-type]
    assert not could_decode_on_device(trainer(folder, "cpu"))  # type: ignore[arg-type]
    assert not could_decode_on_device(trainer(on_gpu, "cuda"))  # type: ignore[arg-type]  # it does already
    masks = SegmentationDataModule(str(image_folder))
    assert not could_decode_on_device(trainer(masks, "cuda"))  # type: ignore[arg-type]  # crops carry masks


def test_every_source_of_encoded_images_decodes_on_the_device(tmp_path: Path) -> None:
    """Tar and Parquet shards and an HDF5 file of encoded images as the folder does; pixels refused, named."""
    root = make_image_folder(tmp_path / "train", num_classes=3, per_class=6, size=(120, 90))
    write_tar_shards(root, tmp_path / "tar", shard_bytes=60_000)
    write_parquet_shards(root, tmp_path / "pq", shard_bytes=60_000, rows_per_group=4)
    convert_folder_to_hdf5(str(root), tmp_path / "enc.h5", mode="encoded", progress=False)
    convert_folder_to_hdf5(str(root), tmp_path / "raw.h5", mode="raw", size=48, progress=False)
    settings = dict(image_size=32, batch_size=8, num_workers=0, seed=1, val_fraction=0)
    makers = {
        "tar": lambda **k: ShardDataModule(sorted(str(p) for p in (tmp_path / "tar").glob("*.tar")), **settings, **k),
        "parquet": lambda **k: ShardDataModule(sorted(str(p) for p in (tmp_path / "pq").glob("*.parquet")), **k,
                                               **settings),
        "hdf5": lambda **k: HDF5DataModule(str(tmp_path / "enc.h5"), **settings, **k),
    }  # fmt: skip
    for make in makers.values():
        reference, ours = make(exact_decode=True), make(decode_on="device")
        for dm in (reference, ours):
            dm.setup("fit")
        assert_same_batches(
            on_device(ours, ours.train_dataloader()), on_device(reference, reference.train_dataloader())
        )
    raw = HDF5DataModule(str(tmp_path / "raw.h5"), decode_on="device", **settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="this HDF5DataModule reads decoded pixels"):
        raw.setup("fit")
