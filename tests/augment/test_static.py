"""The static-shape policy round: the grouped path's pixels bit for bit, every op an identity at its identity
parameter, and the same ops and shapes whatever the draws (the ``meta`` device stands in for a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms.v2 import functional as F

from lightning_fastdata.augment import RandAugment, TrivialAugmentWide, ops
from lightning_fastdata.augment.static import apply_round, sharpness_blur


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
