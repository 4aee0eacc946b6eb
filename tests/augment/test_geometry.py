"""The crop geometry: torchvision's RandomResizedCrop boxes from keyed draws, the centre crop, the resize."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms import RandomResizedCrop

from lightning_fastdata.augment.geometry import (
    CROP_DRAWS,
    center_crop_box,
    crop_draws,
    flip_of,
    random_resized_crop_box,
)
from lightning_fastdata.augment.keyed import uniforms


def test_random_crop_boxes_stay_inside_and_follow_the_ranges() -> None:
    draws = crop_draws(0, [(0, i, 0) for i in range(2000)])
    areas = []
    for row in draws:
        top, left, h, w = random_resized_crop_box(row, 500, 375, (0.08, 1.0), (3 / 4, 4 / 3))
        assert 0 <= top and 0 <= left and top + h <= 375 and left + w <= 500 and h > 0 and w > 0
        areas.append(h * w / (500 * 375))
    assert 0.07 < min(areas) < 0.12 and max(areas) > 0.8


def test_center_crop_box_is_resize_then_center_crop() -> None:
    # Resize(256) + CenterCrop(224) of 500x375: the central 328x328 (375 * 224/256)
    assert center_crop_box(500, 375, 224 / 256) == (23, 86, 328, 328)


def test_a_samples_crop_is_a_function_of_its_key_alone() -> None:
    """The same key gives the same row in any batch, in any order; epoch, index, repeat and seed each change it."""
    keys = [(3, i, r) for i in range(40) for r in range(2)]
    batch = crop_draws(7, keys)
    assert batch.shape == (80, CROP_DRAWS) and batch.dtype == np.float64
    assert ((0 <= batch) & (batch < 1)).all()
    shuffled = crop_draws(7, keys[::-1])
    np.testing.assert_array_equal(batch, shuffled[::-1])
    np.testing.assert_array_equal(batch[5], crop_draws(7, [keys[5]])[0])
    for other in [(4, 2, 0), (3, 3, 0), (3, 2, 1)]:
        assert not np.array_equal(crop_draws(7, [(3, 2, 0)])[0], crop_draws(7, [other])[0])
    assert not np.array_equal(crop_draws(7, [(3, 2, 0)]), crop_draws(8, [(3, 2, 0)]))
    # its own stream: not the numbers a policy on stream 0 draws from the same keys
    policy = uniforms(7, torch.tensor(keys[:4]), 0, CROP_DRAWS).numpy()
    assert not np.isclose(batch[:4], policy).any()


def _quantiles(values: list[float]) -> np.ndarray:
    return np.quantile(np.asarray(values), [0.1, 0.25, 0.5, 0.75, 0.9])


@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500), (160, 120)])
def test_keyed_boxes_are_distributed_as_torchvisions_get_params(width: int, height: int) -> None:
    """Area, aspect, position and flip of 4,000 keyed boxes against 4,000 of torchvision's own: the same deciles
    within sampling noise (a bug in a range, a swapped width and height, or a biased position moves them further)."""
    n = 4000
    torch.manual_seed(0)
    theirs = [
        RandomResizedCrop.get_params(torch.empty(0, height, width), [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)
    ]
    draws = crop_draws(0, [(1, i, 0) for i in range(n)])
    ours = [random_resized_crop_box(row, width, height) for row in draws]

    def features(boxes: list[tuple[int, int, int, int]]) -> dict[str, np.ndarray]:
        return {
            "area": _quantiles([h * w / (width * height) for _, _, h, w in boxes]),
            "log aspect": _quantiles([math.log(w / h) for _, _, h, w in boxes]),
            "centre y": _quantiles([(t + h / 2) / height for t, _, h, _ in boxes]),
            "centre x": _quantiles([(left + w / 2) / width for _, left, _, w in boxes]),
        }

    a, b = features(ours), features(theirs)
    for name in a:
        assert np.abs(a[name] - b[name]).max() < 0.04, (name, a[name], b[name])
    flips = np.mean([flip_of(row) for row in draws])
    assert 0.47 < flips < 0.53


def test_the_fallback_is_torchvisions_centre_crop_exactly() -> None:
    """No try fits an extreme aspect: torchvision's clamped centre crop, whatever the draws."""
    rng = np.random.default_rng(0)
    for width, height in [(1000, 10), (10, 1000)]:
        top, left, h, w = RandomResizedCrop.get_params(torch.empty(0, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
        for _ in range(5):
            assert random_resized_crop_box(rng.random(CROP_DRAWS), width, height) == (top, left, h, w)


def test_too_few_draws_is_an_error() -> None:
    with pytest.raises(ValueError, match=f"needs {CROP_DRAWS} draws"):
        random_resized_crop_box([0.5] * 5, 100, 100)
