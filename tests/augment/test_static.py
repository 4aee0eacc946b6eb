"""The static-shape policy round: the grouped path's pixels bit for bit, every op an identity at its identity
parameter, and the same ops and shapes whatever the draws (the ``meta`` device stands in for a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms.v2 import functional as F

from lightning_fastdata.augment import RandAugment, TrivialAugmentWide, ops
from lightning_fastdata.augment.graphed.static import apply_round, sharpness_blur


@pytest.fixture(scope="module")
def photos(image_folder: Path) -> torch.Tensor:
    files = sorted(image_folder.glob("*/*.jpg"))[:24]
    return torch.stack([F.center_crop(decode_jpeg(read_file(str(p))), [64, 64]) for p in files])


def keys_of(n: int, epoch: int = 0) -> torch.Tensor:
    return torch.stack([torch.full((n,), epoch), torch.arange(n), torch.zeros(n, dtype=torch.int64)], 1)


@pytest.mark.parametrize("size", [(64, 64), (48, 40)], ids=["square", "odd"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, 128.0], ids=["black", "fill"])
def test_a_static_round_gives_the_grouped_paths_pixels_bit_for_bit(
    photos: torch.Tensor, size: tuple[int, int], interpolation: str, fill: float | None
) -> None:
    images = photos[..., : size[0], : size[1]].contiguous()
    for policy in (TrivialAugmentWide(interpolation=interpolation, fill=fill),
                   RandAugment(num_ops=2, magnitude=9, interpolation=interpolation, fill=fill)):  # fmt: skip
        for seed, epoch in ((0, 0), (1, 3), (7, 11), (123, 2)):
            keys = keys_of(len(images), epoch)
            policy.shapes = "grouped"
            grouped = policy(images, keys, seed)
            policy.shapes = "static"
            got = policy(images, keys, seed)
            assert torch.equal(got, grouped), (type(policy).__name__, seed, epoch)


def test_every_op_drawn_by_every_sample_matches_the_grouped_path(photos: torch.Tensor) -> None:
    """All 14 ops of TrivialAugmentWide's table at several magnitudes and both signs, each on the whole batch."""
    policy = TrivialAugmentWide()
    names = list(policy.space)
    table, signed = policy._table(64, 64)
    for k, name in enumerate(names):
        for magnitude_bin in (0, 7, 20, 30):  # bin 20 of Rotate: 90 degrees, an exact turn
            m = table[k, magnitude_bin].item()
            for sign in (1.0, -1.0) if bool(signed[k]) else (1.0,):
                magnitude = torch.full((len(photos),), sign * m, dtype=torch.float64)
                want = policy._apply_round_grouped([name] * len(photos), magnitude, photos)
                assert torch.equal(apply_round(photos, [name] * len(photos), magnitude, None, "nearest"), want), (
                    name, magnitude_bin, sign,
                )  # fmt: skip


def test_each_op_is_an_identity_at_its_identity_parameter(photos: torch.Tensor) -> None:
    n = len(photos)
    one, zero = torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for fn in (ops.adjust_brightness, ops.adjust_saturation, ops.adjust_contrast):
        assert torch.equal(fn(photos, one), photos)
    assert torch.equal(ops.posterize(photos, torch.full((n,), 8)), photos)
    assert torch.equal(ops.solarize(photos, torch.full((n,), 256.0)), photos)
    assert not torch.equal(ops.solarize(photos, torch.full((n,), 255.0)), photos)  # 255 is not: white turns black
    assert torch.equal(apply_round(photos, ["Identity"] * n, zero, None, "nearest"), photos)
    assert torch.equal(apply_round(photos, ["Identity"] * n, zero, 128.0, "bilinear"), photos)


def test_the_sharpness_blur_by_shifted_adds_is_the_convolutions_rounded_blur(photos: torch.Tensor) -> None:
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    conv = torch.nn.functional.conv2d(photos.float(), kernel.expand(3, 1, 3, 3), groups=3).round_()
    assert torch.equal(sharpness_blur(photos), conv)


def test_a_static_round_runs_the_same_ops_and_shapes_whatever_the_draws() -> None:
    """On the ``meta`` device (standing in for a GPU): two batches whose samples drew different ops, one of them no
    warp and no histogram op at all, record the same sequence of ops and shapes on the device."""
    from benchmarks.recorder import OpRecorder

    images = torch.empty(16, 3, 32, 32, dtype=torch.uint8, device="meta")
    sequences = []
    for names in (["Identity"] * 16, ["Rotate", "Equalize", "Posterize", "ShearX"] * 4):
        magnitude = torch.linspace(0.1, 0.9, 16, dtype=torch.float64)
        with OpRecorder() as rec:
            out = apply_round(images, names, magnitude, None, "nearest")
        assert out.shape == images.shape and out.device.type == "meta"
        sequences.append([(r.op, r.calls, r.max_elements) for r in rec.rows.values() if r.device == "meta"])
    assert sequences[0] == sequences[1] and len(sequences[0]) > 10


def test_the_gpu_checks_static_variant_trains_the_whole_recipe_with_static_rounds() -> None:
    """``--recipe-variants static-policy`` (the GPU check's diagnose preset): the same recipe, its policies' rounds in
    static shapes; the recipe's own objects are left as they were."""
    from benchmarks.gpu_recipe import VARIANTS
    from lightning_fastdata.recipe import load_recipe

    made, _ = load_recipe("recipe_torchvision")
    variant = VARIANTS["static-policy"](made)
    assert set(variant) == set(made) and variant["batch_transforms"] is made["batch_transforms"]
    (ours,), (theirs,) = variant["device_transforms"], made["device_transforms"]
    assert ours.shapes == "static" and theirs.shapes == "grouped" and type(ours) is type(theirs)


@pytest.mark.parametrize(
    "after",
    ["recipe", "mixup", "cutmix", "erasing-twice", "none"],
)
def test_the_static_device_half_gives_the_eager_pixels_and_targets_bit_for_bit(
    photos: torch.Tensor, after: str
) -> None:
    """The recipe's device half (a policy, RandomErasing, MixUp or CutMix) with every parameter drawn on the host into
    one buffer and a fixed sequence of ops: the eager path's images and soft targets, over several batches' keys."""
    from torchvision.transforms import v2

    from lightning_fastdata.augment import RandomErasing
    from lightning_fastdata.augment.graphed.half import StaticDeviceHalf, static_capable
    from lightning_fastdata.augment.normalize import Normalizer
    from lightning_fastdata.augment.pipeline import DeviceAugment

    batch = {
        "recipe": [RandomErasing(0.5), v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])],
        "mixup": [v2.MixUp(alpha=0.4)],
        "cutmix": [v2.CutMix(alpha=1.0)],
        "erasing-twice": [RandomErasing(0.7), RandomErasing(0.7, value=1.0)],
        "none": [],
    }[after]
    augment = DeviceAugment([TrivialAugmentWide(), RandAugment(num_ops=2)], batch, seed=5)
    assert static_capable(augment)
    half, normalize = StaticDeviceHalf(augment), Normalizer((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    labels = torch.arange(len(photos)) % 3
    for epoch in range(6):
        keys = keys_of(len(photos), epoch)
        want = augment(photos.clone(), labels, keys, normalize, num_classes=3)
        got = half(photos.clone(), labels, keys, normalize, num_classes=3)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), epoch


def test_the_static_device_half_runs_one_sequence_of_ops_and_refuses_what_it_cannot_do() -> None:
    """On the ``meta`` stand-in: after a warm-up (the normaliser's constants, as a graph capture warms up), the
    recipe's run reads its buffer (copied once, before) and records the same ops and shapes for batches that drew
    MixUp and CutMix, erased boxes or none; a ColorJitter has no static form."""
    from torchvision.transforms import v2

    from benchmarks.recorder import OpRecorder
    from lightning_fastdata.augment import ColorJitter, RandomErasing
    from lightning_fastdata.augment.graphed.half import StaticDeviceHalf
    from lightning_fastdata.augment.graphed.static import unpack
    from lightning_fastdata.augment.normalize import Normalizer
    from lightning_fastdata.augment.pipeline import DeviceAugment

    mixing = v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])
    half = StaticDeviceHalf(DeviceAugment([TrivialAugmentWide()], [RandomErasing(0.25), mixing], seed=0))
    images = torch.empty(16, 3, 32, 32, dtype=torch.uint8, device="meta")
    labels = torch.empty(16, dtype=torch.int64, device="meta")
    normalize = Normalizer((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    sequences, draws = [], set()
    warm = half.plan(keys_of(16, 99), 16, 32, 32)
    half.run(images, labels, unpack(warm[0].to("meta"), warm[1]), normalize, 3)  # the normaliser's constants, once
    for epoch in range(8):
        buffer, layout = half.plan(keys_of(16, epoch), 16, 32, 32)
        draws.add(tuple(buffer[-4:].tolist()) == (0.0, 0.0, 0.0, 0.0))  # MixUp: an empty box
        params = unpack(buffer.to("meta"), layout)
        with OpRecorder() as rec:
            out, targets = half.run(images, labels, params, normalize, num_classes=3)
        assert out.shape == images.shape and targets.shape == (16, 3)
        assert not [r for r in rec.rows.values() if r.device == "cpu" and r.max_elements > 64], "batch work on the host"
        sequences.append([(r.op, r.calls, r.max_elements) for r in rec.rows.values() if r.device == "meta"])
    assert draws == {True, False}  # both MixUp and CutMix were drawn
    assert all(s == sequences[0] for s in sequences)
    with pytest.raises(ValueError, match="without a static form"):
        StaticDeviceHalf(DeviceAugment([ColorJitter(0.4)], [], seed=0))


def recipe_half() -> Any:
    from torchvision.transforms import v2

    from lightning_fastdata.augment import RandomErasing
    from lightning_fastdata.augment.pipeline import DeviceAugment

    mixing = v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])
    return DeviceAugment([TrivialAugmentWide()], [RandomErasing(0.5), mixing], seed=3)


def test_a_captured_device_half_replays_the_eager_results_pads_the_last_batch_and_copies_its_outputs(
    photos: torch.Tensor,
) -> None:
    """With the stand-in graph (it replays into fixed outputs, as a CUDA graph does): each batch's result is the
    eager path's, a shorter last batch is padded (its MixUp/CutMix pairs its own, its draws its own keys'), every
    output is a copy (the next replay does not change it), and a batch of another image size runs eagerly."""
    from lightning_fastdata.augment.graphed.captured import CapturedDeviceHalf, EagerGraph, pad_index
    from lightning_fastdata.augment.graphed.half import StaticDeviceHalf
    from lightning_fastdata.augment.normalize import Normalizer

    augment = recipe_half()
    captured = CapturedDeviceHalf(StaticDeviceHalf(augment), EagerGraph())
    normalize = Normalizer((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    labels = torch.arange(len(photos)) % 3
    results = []
    for epoch, n in ((0, 24), (1, 24), (2, 17), (3, 24), (4, 5)):
        keys = keys_of(n, epoch)
        want = augment(photos[:n].clone(), labels[:n], keys, normalize, num_classes=3)
        got = captured(photos[:n].clone(), labels[:n], keys, normalize, num_classes=3)
        assert got[0].shape == want[0].shape and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), epoch
        results.append((got, want))
    for got, want in results:  # later replays wrote into the graph's outputs, not into what was handed out
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert captured.replays == 5 and captured.eager_calls == 0
    assert pad_index(3, 7).tolist() == [2, 0, 1, 2, 0, 1, 2]  # the row before the real ones: the last real one
    smaller = photos[:, :, :48, :48].contiguous()
    keys = keys_of(24, 9)
    want = augment(smaller.clone(), labels, keys, normalize, num_classes=3)
    got = captured(smaller.clone(), labels, keys, normalize, num_classes=3)
    assert captured.eager_calls == 1 and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.timeout(120)
def test_the_gpu_checks_graphed_variant_gives_the_datamodules_own_batches(image_folder: Path) -> None:
    """``--recipe-variants graphed`` is ``FastDataCallback(device_half="graphed")``, which puts the captured device
    half where the DataModule's device half was on a GPU: the batches after transfer are the eager ones (here with
    the CPU's stand-in graph, put in place by hand, replaying)."""
    from benchmarks.gpu_recipe import _CALLBACK
    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.augment.graphed.captured import CapturedDeviceHalf, EagerGraph
    from lightning_fastdata.augment.graphed.half import StaticDeviceHalf
    from lightning_fastdata.recipe import load_recipe

    assert _CALLBACK["graphed"] == {"device_half": "graphed"}

    made, _ = load_recipe("recipe_torchvision")
    made["image_size"] = 32

    def module() -> ImageFolderDataModule:
        dm = ImageFolderDataModule(str(image_folder), batch_size=8, num_workers=0, val_fraction=0, **made)
        dm.setup("fit")
        return dm

    plain, graphed = module(), module()
    graphed.transfer.device_augment = CapturedDeviceHalf(
        StaticDeviceHalf(graphed.transfer.device_augment), EagerGraph()
    )
    assert isinstance(graphed.transfer.device_augment, CapturedDeviceHalf)
    for a, b in zip(plain.train_dataloader(), graphed.train_dataloader()):
        want = plain.on_after_batch_transfer(plain.transfer_batch_to_device(a, torch.device("cpu"), 0), 0)
        got = graphed.on_after_batch_transfer(graphed.transfer_batch_to_device(b, torch.device("cpu"), 0), 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert graphed.transfer.device_augment.replays == len(plain.train_dataloader())
