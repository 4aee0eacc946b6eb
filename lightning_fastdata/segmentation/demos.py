"""Demo data for segmentation: photo-like scenes of coloured shapes whose masks are known, in the common layouts.

Each scene is a grey photo-like background (class 0) with a few ellipses, boxes and triangles, each filled with its
class's colour (:data:`SEGMENTATION_COLOURS`); the mask holds each pixel's class, 255 (ignored) on a thin border
around every shape, as VOC's masks have. A pixel's class is a function of its colour (:func:`classes_of_colours`:
grey is background, a saturated colour is the class of the nearest palette colour), so after any augmentation a
test can check ``mask == classes_of_colours(image)`` away from the shapes' edges: a flip or crop that moved the
image and not the mask, or the reverse, cannot pass.

:func:`make_segmentation_folder` writes them in VOC's layout (``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png``
palette PNGs whose indices are the classes, ``ImageSets/Segmentation/{train,val}.txt``), ADE20K's or Cityscapes';
each file written atomically.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from lightning_fastdata.demos import photo_like_image
from lightning_fastdata.loading.atomic import atomic_path, atomic_write_bytes, atomic_write_text
from lightning_fastdata.segmentation.layouts import voc_palette

__all__ = [
    "CITYSCAPES_IDS_OF_CLASSES",
    "SEGMENTATION_CLASSES",
    "SEGMENTATION_COLOURS",
    "classes_of_colours",
    "make_segmentation_folder",
    "make_segmentation_hdf5",
    "segmentation_scene",
]

#: The demo's classes: background, then one per shape colour.
SEGMENTATION_CLASSES = ("background", "red", "green", "blue", "yellow", "magenta")
#: Each class's fill colour (RGB); background pixels are grey.
SEGMENTATION_COLOURS = np.array(
    [[128, 128, 128], [225, 30, 30], [30, 200, 40], [40, 70, 235], [235, 220, 40], [215, 45, 215]], dtype=np.int32
)
#: The mask value of the borders (and, in training, of padding): ignored.
BORDER = 255


def segmentation_scene(rng: np.random.Generator, width: int, height: int) -> tuple[Image.Image, np.ndarray]:
    """One scene: an RGB image and its ``height x width`` uint8 mask (module docstring)."""
    grey = np.asarray(photo_like_image(rng, width, height, float(rng.random())).convert("L"))
    image = Image.fromarray(np.stack([grey] * 3, axis=-1))
    mask = Image.new("L", (width, height), 0)
    paint, label = ImageDraw.Draw(image), ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(2, 6))):
        cls = int(rng.integers(1, len(SEGMENTATION_CLASSES)))
        w, h = rng.uniform(0.15, 0.5) * width, rng.uniform(0.15, 0.5) * height
        x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
        box = [x, y, x + w, y + h]
        colour = tuple(int(v) for v in SEGMENTATION_COLOURS[cls])
        kind = int(rng.integers(3))
        for draw, fill, outline in ((paint, colour, None), (label, cls, BORDER)):
            if kind == 0:
                draw.ellipse(box, fill=fill, outline=outline, width=3 if outline else 0)
            elif kind == 1:
                draw.rectangle(box, fill=fill, outline=outline, width=3 if outline else 0)
            else:
                draw.polygon(
                    [(x, y + h), (x + w / 2, y), (x + w, y + h)], fill=fill, outline=outline, width=3 if outline else 1
                )
    return image, np.asarray(mask, dtype=np.uint8).copy()


def classes_of_colours(image: np.ndarray, min_saturation: int = 60) -> np.ndarray:
    """Each pixel's class from its colour: background where grey, else the nearest class colour.

    ``image``: ``H x W x 3`` or ``3 x H x W`` uint8.
    """
    rgb = np.asarray(image)
    if rgb.shape[0] == 3 and rgb.shape[-1] != 3:
        rgb = rgb.transpose(1, 2, 0)
    rgb = rgb.astype(np.int32)
    saturation = rgb.max(axis=-1) - rgb.min(axis=-1)
    distance = ((rgb[..., None, :] - SEGMENTATION_COLOURS[1:]) ** 2).sum(axis=-1)
    classes = 1 + distance.argmin(axis=-1)
    return np.where(saturation >= min_saturation, classes, 0).astype(np.uint8)


#: Cityscapes' label id of each demo class (whose training id is the demo class): road, sidewalk, building, wall,
#: fence, pole; borders get id 0 (unlabelled, ignored).
CITYSCAPES_IDS_OF_CLASSES = (7, 8, 11, 12, 13, 17)


def make_segmentation_folder(
    root: str | Path, count: int = 40, size: tuple[int, int] = (500, 375), quality: int = 90, seed: int = 0,
    val_fraction: float = 0.2, layout: Literal["voc", "ade20k", "cityscapes"] = "voc", fixed_size: bool = False,
) -> Path:  # fmt: skip
    """Write ``count`` scenes under ``root`` (module docstring); return ``root`` as a ``Path``.

    Sizes vary between 85% and 100% of ``size`` (width, height); a fifth are portrait (``fixed_size``: every scene
    ``size``). The last ``val_fraction`` of
    the scenes are the validation split. ``layout``: VOC's (palette masks, 255 borders, split lists), ADE20K's
    (``images/{training,validation}``, ``annotations/...``: grey masks holding class + 1, 0 on the borders) or
    Cityscapes' (PNG images in ``leftImg8bit/{train,val}/<city>``, ``gtFine`` label ids by
    :data:`CITYSCAPES_IDS_OF_CLASSES`, 0 on the borders; a colour file beside each, as Cityscapes has).
    """
    root = Path(root)
    rng = np.random.default_rng([seed, 0x5E6])
    palette = voc_palette()
    ids = [f"scene_{i:06d}" for i in range(count)]
    cut = len(ids) - int(round(val_fraction * len(ids)))
    for k, name in enumerate(ids):
        w, h = int(size[0] * rng.uniform(0.85, 1.0)), int(size[1] * rng.uniform(0.85, 1.0))
        if rng.random() < 0.2:
            w, h = h, w
        if fixed_size:
            w, h = size
        image, mask = segmentation_scene(rng, w, h)
        encoded, png = io.BytesIO(), io.BytesIO()
        if layout == "voc":
            image.save(encoded, "JPEG", quality=quality)
            indexed = Image.fromarray(mask, mode="L").convert("P")
            indexed.putpalette(palette)
            indexed.save(png, "PNG")
            files = [(f"JPEGImages/{name}.jpg", encoded), (f"SegmentationClass/{name}.png", png)]
        elif layout == "ade20k":
            split = "training" if k < cut else "validation"
            image.save(encoded, "JPEG", quality=quality)
            Image.fromarray(np.where(mask == BORDER, 0, mask + 1).astype(np.uint8), mode="L").save(png, "PNG")
            files = [(f"images/{split}/ADE_{name}.jpg", encoded), (f"annotations/{split}/ADE_{name}.png", png)]
        else:
            split = "train" if k < cut else "val"
            city = ("aachen", "bremen")[k % 2]
            stem = f"{split}/{city}/{city}_{k:06d}_000019"
            image.save(encoded, "PNG")
            ids_of = np.array([*CITYSCAPES_IDS_OF_CLASSES, *[0] * (256 - len(CITYSCAPES_IDS_OF_CLASSES))], np.uint8)
            Image.fromarray(ids_of[mask], mode="L").save(png, "PNG")
            colour = io.BytesIO()
            image.save(colour, "PNG")
            files = [
                (f"leftImg8bit/{stem}_leftImg8bit.png", encoded),
                (f"gtFine/{stem}_gtFine_labelIds.png", png),
                (f"gtFine/{stem}_gtFine_color.png", colour),
            ]
        for rel, buffer in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(root / rel, buffer.getvalue(), fsync=False)
    if layout == "voc":
        (root / "ImageSets" / "Segmentation").mkdir(parents=True, exist_ok=True)
        atomic_write_text(root / "ImageSets" / "Segmentation" / "train.txt", "\n".join(ids[:cut]) + "\n")
        atomic_write_text(root / "ImageSets" / "Segmentation" / "val.txt", "\n".join(ids[cut:]) + "\n")
    elif layout == "ade20k":
        atomic_write_text(root / "objectInfo150.txt", "Idx\tRatio\tTrain\tVal\tName\n")
    return root


def make_segmentation_hdf5(
    path: str | Path, count: int = 40, size: tuple[int, int] = (160, 120), seed: int = 0, encoded: bool = False,
    val_fraction: float = 0.25, groups: bool = True,
) -> Path:  # fmt: skip
    """Write ``count`` scenes of one ``size`` (width, height) to an HDF5 file; return its path.

    ``images``: decoded ``N x H x W x 3`` uint8, or (``encoded``) one JPEG byte string each; ``masks``:
    ``N x H x W x 1`` uint8 (the classes, 255 on borders). With ``groups`` the last ``val_fraction`` are in ``val/``
    and the others in ``train/``; without, everything at the top level. Written to a temporary name, then renamed.
    """
    import h5py

    path = Path(path)
    rng = np.random.default_rng([seed, 0x5E7])
    scenes = [segmentation_scene(rng, size[0], size[1]) for _ in range(count)]
    cut = count - int(round(val_fraction * count)) if groups else count
    parts = {"train": scenes[:cut], "val": scenes[cut:]} if groups else {"": scenes}
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for group, items in parts.items():
            prefix = f"{group}/" if group else ""
            if encoded:
                data = f.create_dataset(f"{prefix}images", (len(items),), dtype=h5py.vlen_dtype(np.uint8))
                for k, (image, _) in enumerate(items):
                    buffer = io.BytesIO()
                    image.save(buffer, "JPEG", quality=90)
                    data[k] = np.frombuffer(buffer.getvalue(), np.uint8)
            else:
                f[f"{prefix}images"] = np.stack([np.asarray(image) for image, _ in items])
            f[f"{prefix}masks"] = np.stack([mask[..., None] for _, mask in items])
    return path
