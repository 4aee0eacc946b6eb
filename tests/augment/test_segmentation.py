"""Segmentation geometry (issue 63, first part): one window for an image and its mask, checked on scenes whose
classes are their colours, so an image and a mask that moved apart cannot pass."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_fastdata.loading.jpeg.decode import decode_resized_crop
from lightning_fastdata.segmentation.demos import (
    SEGMENTATION_CLASSES,
    classes_of_colours,
    make_segmentation_folder,
    segmentation_scene,
)
from lightning_fastdata.segmentation.target import IGNORE_INDEX
from lightning_fastdata.sources.window import (
    eval_window,
    render_mask,
    train_window,
    window_draws,
)


def interior(mask: np.ndarray, margin: int = 3) -> np.ndarray:
    """Pixels of a class (not ignored) whose ``(2 margin + 1)``-square neighbourhood holds that class alone."""
    h, w = mask.shape
    padded = np.pad(mask.astype(np.int32), margin, constant_values=-1)
    same = np.ones_like(mask, dtype=bool)
    for dy in range(2 * margin + 1):
        for dx in range(2 * margin + 1):
            same &= padded[dy : dy + h, dx : dx + w] == mask
    return same & (mask != IGNORE_INDEX)


def render(jpeg: bytes, mask: np.ndarray, window, flip_mask: bool | None = None) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """The image (decoded crop only, padding 0) and the mask through ``window`` (``flip_mask``: a wrong flip)."""
    image = torch.zeros(3, *window.size, dtype=torch.uint8)
    top, left, ph, pw = window.place
    decode_resized_crop(jpeg, image[:, top : top + ph, left : left + pw], lambda w, h: window.box, flip=window.flip)
    if flip_mask is not None:
        window = type(window)(window.box, window.place, window.size, flip_mask)
    return image.numpy(), render_mask(mask, window).numpy()


@pytest.fixture(scope="module")
def scenes() -> list[tuple[bytes, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for w, h in ((500, 375), (375, 500), (180, 120)):
        image, mask = segmentation_scene(rng, w, h)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90)
        out.append((buf.getvalue(), mask))
    return out


def test_a_scenes_classes_are_its_colours_away_from_edges(scenes: list[tuple[bytes, np.ndarray]]) -> None:
    for jpeg, mask in scenes:
        decoded = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
        keep = interior(mask)
        assert keep.mean() > 0.5 and len(np.unique(mask[keep])) > 2
        assert (classes_of_colours(decoded)[keep] == mask[keep]).mean() > 0.999


def test_training_windows_are_the_references_resize_flip_and_padded_crop() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        w, h = int(rng.integers(60, 900)), int(rng.integers(60, 900))
        draws = rng.random(4)
        win = train_window(draws, w, h, base_size=520, crop_size=480)
        top, left, bh, bw = win.box
        pt, pl, ph, pw = win.place
        assert win.size == (480, 480) and (pt, pl) == (0, 0) and 0 < ph <= 480 and 0 < pw <= 480
        assert 0 <= top and top + bh <= h and 0 <= left and left + bw <= w
        size = 260 + min(int(draws[0] * 781), 780)  # random.randint(0.5 x 520, 2 x 520)
        s = size / min(w, h)
        for extent, place, length in ((bh, ph, h), (bw, pw, w)):
            if length * s >= 480:  # a full crop of the resized image: the box is the crop, at the scale
                assert place == 480 and abs(extent - 480 / s) <= 0.5 + 1e-9 or extent == length
            else:  # the resized image is smaller: all of it, padded after
                assert extent == length and abs(place - length * s) <= 0.5 + 1e-9
        assert win.flip == (draws[1] < 0.5)
    assert eval_window(500, 375, 520).size == (520, 693) and eval_window(375, 500, 520).box == (0, 0, 500, 375)


@pytest.mark.parametrize("base, crop", [(520, 480), (96, 64), (200, 300)])
def test_image_and_mask_follow_one_window_exactly(scenes: list[tuple[bytes, np.ndarray]], base: int, crop: int) -> None:
    """Keyed windows (flips, crops, small images padded): the rendered mask is the rendered image's classes on every
    interior pixel; the same window with the mask's flip wrong fails, so the check can see a misalignment."""
    keys = [(epoch, i, 0) for epoch in range(8) for i in range(len(scenes))]
    draws = window_draws(1, keys)
    flipped = agree = seen = 0
    for (_, i, _), d in zip(keys, draws):
        jpeg, mask = scenes[i]
        h, w = mask.shape
        win = train_window(d, w, h, base, crop)
        image, target = render(jpeg, mask, win)
        keep = interior(target)
        assert keep.sum() > 50
        assert (classes_of_colours(image)[keep] == target[keep]).mean() > 0.99
        pt, pl, ph, pw = win.place
        assert (target[ph:, :] == IGNORE_INDEX).all() and (target[:, pw:] == IGNORE_INDEX).all()  # padding
        assert (image[:, ph:, :] == 0).all() and (image[:, :, pw:] == 0).all()
        if win.flip:
            flipped += 1
            _, wrong = render(jpeg, mask, win, flip_mask=False)
            shapes = interior(wrong) & (wrong != 0)  # the shapes' pixels: a wrong flip moves them
            agree += int((classes_of_colours(image)[shapes] == wrong[shapes]).sum())
            seen += int(shapes.sum())
    assert 0 < flipped < len(keys) and agree < 0.8 * seen  # with the mask's flip wrong, the check fails
    for jpeg, mask in scenes:  # evaluation: the whole image at the base size
        win = eval_window(mask.shape[1], mask.shape[0], base)
        image, target = render(jpeg, mask, win)
        keep = interior(target)
        assert (classes_of_colours(image)[keep] == target[keep]).mean() > 0.99


def test_the_demo_folder_is_vocs_layout_with_palette_masks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = make_segmentation_folder(tmp_path / "voc", count=10, size=(160, 120))
    train = (root / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
    val = (root / "ImageSets" / "Segmentation" / "val.txt").read_text().split()
    assert len(train) == 8 and len(val) == 2 and not set(train) & set(val)
    png = Image.open(root / "SegmentationClass" / f"{train[0]}.png")
    assert png.mode == "P" and png.getpalette()[3:6] == [128, 0, 0]  # VOC's colour map: class 1 is dark red
    mask = np.asarray(png)
    assert set(np.unique(mask)) <= set(range(len(SEGMENTATION_CLASSES))) | {IGNORE_INDEX}
    image = np.asarray(Image.open(root / "JPEGImages" / f"{train[0]}.jpg").convert("RGB"))
    keep = interior(mask)
    assert image.shape[:2] == mask.shape and (classes_of_colours(image)[keep] == mask[keep]).mean() > 0.999
