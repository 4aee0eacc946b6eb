"""Training recipes through the DataModules: a user's transforms, device policies, MixUp/CutMix, validation sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from lightning_fastdata.augment import RandomErasing, TrivialAugmentWide
from lightning_fastdata.loading.batch import DeviceBatch
from lightning_fastdata.testing.trainer import cpu_trainer

RECIPE: dict[str, Any] = dict(image_size=32, batch_size=8, val_fraction=0.2, seed=3)


def epoch_batches(dm: ImageFolderDataModule, epoch: int) -> list[tuple[torch.Tensor, ...]]:
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [_clone(batch) for batch in loader]


def _clone(batch: tuple[Any, ...]) -> tuple[Any, ...]:
    """A copy of a loader's batch (its buffers are reused), of the same class (a ``DeviceBatch`` stays one)."""
    values = [None if t is None else t.clone() for t in batch]
    return type(batch)(*values) if isinstance(batch, DeviceBatch) else tuple(values)


@pytest.mark.timeout(300)
def test_a_users_v2_transform_gives_the_same_pixels_with_any_worker_count(image_folder: Path) -> None:
    recipe = v2.Compose([v2.TrivialAugmentWide(), v2.RandomGrayscale(0.3)])
    runs = [
        epoch_batches(ImageFolderDataModule(str(image_folder), num_workers=w, train_transforms=recipe, **RECIPE), 1)
        for w in (0, 2)
    ]
    assert len(runs[0]) == len(runs[1]) == 4
    for a, b in zip(*runs):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    plain = epoch_batches(ImageFolderDataModule(str(image_folder), num_workers=0, **RECIPE), 1)
    assert not torch.equal(runs[0][0][0], plain[0][0])  # the transform did something
    other_epoch = epoch_batches(
        ImageFolderDataModule(str(image_folder), num_workers=0, train_transforms=recipe, **RECIPE), 2
    )
    assert not torch.equal(runs[0][0][0], other_epoch[0][0])
    # and the crop + flip of each sample are those of the plain run (the transform draws from its own stream)
    gray_free = epoch_batches(
        ImageFolderDataModule(str(image_folder), num_workers=0, train_transforms=v2.Identity(), **RECIPE), 1
    )
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, gray_free))


def test_a_transform_that_changes_the_size_or_dtype_is_named(image_folder: Path) -> None:
    dm = ImageFolderDataModule(
        str(image_folder), num_workers=0, train_transforms=v2.ToDtype(torch.float32, scale=True), **RECIPE
    )
    with pytest.raises(TypeError, match=r"train_transforms \(ToDtype\) returned torch.float32 .* Leave out"):
        epoch_batches(dm, 0)
    with pytest.raises(TypeError, match="train_transforms should be a callable"):
        ImageFolderDataModule(str(image_folder), train_transforms="TrivialAugmentWide", **RECIPE)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batch_transforms should hold callables"):
        ImageFolderDataModule(str(image_folder), batch_transforms=[3], **RECIPE)  # type: ignore[list-item]


def test_device_policies_and_mixup_cutmix_make_soft_targets_deterministically(image_folder: Path) -> None:
    dm = ImageFolderDataModule(
        str(image_folder),
        num_workers=0,
        device_transforms=v2.TrivialAugmentWide(),  # torchvision's object, run per sample
        batch_transforms=[RandomErasing(0.5), v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])],
        **RECIPE,
    )
    batch = epoch_batches(dm, 0)[0]
    assert batch.images.dtype == torch.uint8 and batch.keys.shape == (8, 3)
    out_images, targets = dm.on_after_batch_transfer(batch, 0)
    assert out_images.dtype == torch.float32 and out_images.shape == (8, 3, 32, 32)
    assert targets.shape == (8, dm.num_classes) and torch.allclose(targets.sum(1), torch.ones(8))
    again_images, again_targets = dm.on_after_batch_transfer(batch, 0)
    assert torch.equal(out_images, again_images) and torch.equal(targets, again_targets)
    plain = ImageFolderDataModule(str(image_folder), num_workers=0, **RECIPE)
    reference, _ = plain.on_after_batch_transfer(batch[:2], 0)
    assert not torch.equal(out_images, reference)
    val = next(iter(dm.val_dataloader()))
    assert len(val) == 2  # validation batches carry no keys and are not augmented


def test_device_augmentation_draws_from_the_batchs_keys_which_the_transfer_leaves_on_the_host(
    image_folder: Path,
) -> None:
    """A keyed training batch is a ``DeviceBatch``; the DataModule's move leaves its keys on the host (no read-back
    from the device, which would wait for the previous step) and the augmentation draws from exactly those keys."""
    dm = ImageFolderDataModule(
        str(image_folder),
        num_workers=0,
        device_transforms=TrivialAugmentWide(),
        batch_transforms=[v2.MixUp(alpha=0.2)],
        **RECIPE,
    )
    batch = epoch_batches(dm, 0)[0]
    assert isinstance(batch, DeviceBatch)
    moved = dm.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved.images.device.type == "meta" and moved.keys is batch.keys
    direct, direct_targets = dm.on_after_batch_transfer(batch, 0)
    again, again_targets = dm.on_after_batch_transfer(batch, 0)
    assert torch.equal(direct, again) and torch.equal(direct_targets, again_targets)
    other = batch.keys.clone()
    other[:, 1] += 1000  # other samples' keys: other draws
    from_other, _ = dm.on_after_batch_transfer(batch._replace(keys=other), 0)
    assert not torch.equal(from_other, direct)
    plain = dm.on_after_batch_transfer(tuple(batch[:3]), 0)  # a plain tuple is not a keyed batch: normalised only
    assert len(plain) == 3 and plain[0].dtype == torch.float32 and torch.equal(plain[2], batch.keys)


def test_validation_resize_and_crop_are_set_apart_from_the_training_size(image_folder: Path) -> None:
    dm = ImageFolderDataModule(
        str(image_folder), num_workers=0, val_resize_size=46, val_crop_size=40, **{**RECIPE, "image_size": 24}
    )
    dm.setup("fit")
    train_images = next(iter(dm.train_dataloader()))[0]
    val_images = next(iter(dm.val_dataloader()))[0]
    assert train_images.shape[-1] == 24 and val_images.shape[-1] == 40
    assert dm.val_crop_fraction == pytest.approx(40 / 46)
    with pytest.raises(ValueError, match="val_crop_size should be positive and at most val_resize_size"):
        ImageFolderDataModule(str(image_folder), val_resize_size=30, val_crop_size=40)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["hdf5", "cache"])
def test_a_recipe_trains_from_hdf5_and_the_cache(image_folder: Path, tmp_path: Path, kind: str) -> None:
    recipe: dict[str, Any] = dict(
        train_transforms=v2.RandAugment(),
        device_transforms=TrivialAugmentWide(),
        batch_transforms=[RandomErasing(0.25), v2.CutMix(alpha=1.0)],
        repeated_augmentations=2,
        val_resize_size=40,
        val_crop_size=36,
    )
    if kind == "hdf5":
        h5 = convert_folder_to_hdf5(image_folder, tmp_path / "d.h5", mode="encoded", processes=1, progress=False)
        dm: Any = HDF5DataModule(str(h5), num_workers=2, **RECIPE, **recipe)
    else:
        dm = TensorCacheDataModule(
            str(image_folder), str(tmp_path / "c"), cache_size=40, build_processes=1, num_workers=2, **RECIPE, **recipe
        )
    trainer = cpu_trainer(epochs=-1, max_steps=5, limit_val_batches=1)
    model = ImageClassifier(num_classes=3, arch="resnet18", label_smoothing=0.1)
    trainer.fit(model, dm)
    assert trainer.global_step == 5 and torch.isfinite(trainer.callback_metrics["train_loss"])
    assert next(iter(dm.val_dataloader()))[0].shape[-1] == 36
    assert "TrivialAugmentWide" in str(model.trainer.datamodule.hparams["device_transforms"])  # saved as text


def test_a_cache_cropping_on_the_device_refuses_a_worker_transform(image_folder: Path, tmp_path: Path) -> None:
    dm = TensorCacheDataModule(
        str(image_folder),
        str(tmp_path / "c"),
        cache_size=40,
        build_processes=1,
        augment_on="device",
        num_workers=0,
        train_transforms=v2.TrivialAugmentWide(),
        **RECIPE,
    )
    with pytest.raises(ValueError, match="augment_on='device' crops on the device"):
        dm.setup("fit")


def test_soft_targets_and_label_smoothing_in_the_classifier() -> None:
    model = ImageClassifier(num_classes=4, arch="resnet18", label_smoothing=0.1)
    logits = torch.randn(6, 4)
    hard = torch.tensor([0, 1, 2, 3, 0, 1])
    soft = torch.nn.functional.one_hot(hard, 4).float()
    assert torch.allclose(model.train_loss(logits, soft), model.train_loss(logits, hard))
    assert model.train_loss(logits, hard) != model.loss(logits, hard)  # validation loss unsmoothed
    with pytest.raises(ValueError, match="label_smoothing"):
        ImageClassifier(num_classes=4, label_smoothing=1.5)


def test_the_classifiers_fused_adamw_makes_the_same_update_as_torchs_default() -> None:
    """``configure_optimizers`` picks torch's fused AdamW (a few launches a step instead of ~15 and two host reads per
    parameter): three steps with the same gradients move every parameter as the default ``foreach`` AdamW does."""
    torch.manual_seed(0)
    fused_model = ImageClassifier(num_classes=3, arch="resnet18", lr=1e-2, weight_decay=0.05)
    default_model = ImageClassifier(num_classes=3, arch="resnet18", lr=1e-2, weight_decay=0.05)
    default_model.load_state_dict(fused_model.state_dict())
    start = [p.detach().clone() for p in fused_model.parameters()]
    fused_opt = fused_model.configure_optimizers()
    assert fused_opt.defaults["fused"] is True
    default_opt = torch.optim.AdamW(default_model.parameters(), lr=1e-2, weight_decay=0.05)
    assert default_opt.defaults["fused"] is None and default_opt.defaults["foreach"] is None  # torch's default
    for step in range(3):
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(step)) for p in start]
        for model, opt in ((fused_model, fused_opt), (default_model, default_opt)):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            opt.step()
    for a, b, s in zip(fused_model.parameters(), default_model.parameters(), start):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the fused kernel may round in another order
        assert float((a - s).detach().abs().mean()) > 1e-3  # every parameter moved (three steps of lr 1e-2)


def test_the_progress_bar_shows_loss_and_acc_and_the_logger_gets_the_exact_train_values(image_folder: Path) -> None:
    """``train_loss``/``train_acc`` for the logger and callbacks; the bar's ``loss``/``acc`` (on a CPU the same step's
    values; on a GPU the previous step's, read without a wait: ``tests/test_cuda.py``)."""
    dm = ImageFolderDataModule(str(image_folder), image_size=32, batch_size=8, num_workers=0, val_fraction=0)
    trainer = cpu_trainer(epochs=-1, max_steps=3)
    trainer.fit(ImageClassifier(num_classes=3), dm)
    bar, metrics = trainer.progress_bar_metrics, trainer.callback_metrics
    assert "train_loss" not in bar and "train_acc" not in bar
    assert bar["loss"] == pytest.approx(float(metrics["train_loss"])) and bar["acc"] == pytest.approx(
        float(metrics["train_acc"])
    )


@pytest.mark.timeout(120)
def test_the_reference_loaders_worker_side_objects_hold_no_device_state(image_folder: Path) -> None:
    """torchvision's reference loader of a recipe runs the recipe's transform objects in forked workers; the same
    objects ran our device half on a device first (``meta`` stands in for a GPU). Nothing on a device may be
    reachable from them (a forked worker that touches CUDA memory dies), and a transform that holds some is refused
    when the loader is made, not at the step a worker dies."""
    from lightning_fastdata.recipe import device_tensors, load_recipe, reference_loader

    made, _ = load_recipe("recipe_torchvision")
    made["image_size"] = 32
    dm = ImageFolderDataModule(str(image_folder), batch_size=8, num_workers=0, val_fraction=0, **made)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    moved = dm.transfer_batch_to_device(batch, torch.device("meta"), 0)
    images, targets = dm.on_after_batch_transfer(moved, 0)  # the device half, on the stand-in device
    assert images.device.type == "meta" and targets.shape == (8, 3)
    loader = reference_loader(str(image_folder), made, batch_size=8, workers=0)
    assert device_tensors((loader.dataset, loader.collate_fn)) == []
    x, y = next(iter(loader))
    assert x.shape == (8, 3, 32, 32) and y.shape == (8, 3)

    held = torch.zeros(3, device="meta")

    def shifted(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return images + held.sum(), labels

    assert device_tensors([{"fn": shifted}]) == ["Tensor (3,) on meta"]
    with pytest.raises(ValueError, match=r"hold tensors on a device \(Tensor \(3,\) on meta\)"):
        reference_loader(str(image_folder), {**made, "batch_transforms": [shifted]}, batch_size=8, workers=0)
