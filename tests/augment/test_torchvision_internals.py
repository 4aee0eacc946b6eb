"""The augmentation room's one adapter to torchvision's private API: checked at import, with its fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from lightning_fastdata.augment import ops
from lightning_fastdata.augment import torchvision_internals as tv
from lightning_fastdata.augment.worker import WorkerTrivialAugmentWide, accelerate


def test_this_torchvision_has_every_private_name_the_room_uses() -> None:
    assert tv.MISSING == [] and all(tv.checks().values())
    assert set(tv.WORKER_NAMES) <= set(tv.checks())  # the worker's names are among those checked
    space = tv.augmentation_space(v2.TrivialAugmentWide)
    assert space is not None and "ShearX" in space and tv.augmentation_space(v2.Compose) is None


def test_without_the_worker_names_a_users_policy_stays_torchvisions_own(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = v2.TrivialAugmentWide()
    assert type(accelerate(policy)) is WorkerTrivialAugmentWide
    monkeypatch.setattr(tv, "MISSING", [tv.WORKER_NAMES[0]])
    assert accelerate(policy) is policy  # slower, the same pixels: torchvision's object as it is


def test_without_the_hue_conversions_adjust_hue_runs_torchvisions_public_op(
    image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = torch.randint(0, 256, (4, 3, 24, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    shifts = torch.tensor([-0.4, -0.1, 0.0, 0.3], dtype=torch.float64)
    batched = ops.adjust_hue(images, shifts)
    monkeypatch.setattr(tv, "rgb_to_hsv", None)
    fallback = ops.adjust_hue(images, shifts)
    public = torch.stack([F.adjust_hue(im, float(s)) for im, s in zip(images, shifts)])
    assert torch.equal(fallback, public) and torch.equal(batched, public)
