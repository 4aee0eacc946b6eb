"""Image-text demo data: photo-like scenes with one coloured shape, captioned, as img2dataset's tar shards.

Each image is a grey photo-like background with one large square or disc filled with one of
:data:`CAPTION_COLOURS`; its caption says so (``"a red disc on a dark photo"``), so a small contrastive model learns
to match them in a few epochs and zero-shot classification by colour (``"a photo of a red shape."``) is meaningful.
The shards are img2dataset's layout (``key.jpg``, ``key.txt``, ``key.json`` with ``caption``, ``url``, ``width``,
``height``), in ``train/`` and ``val/``; every 25th key lost its image, as a failed download leaves it (skipped and
counted by :class:`~lightning_fastdata.ImageTextDataModule`).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from lightning_fastdata.demos import photo_like_image

__all__ = ["CAPTION_COLOURS", "caption_scene", "make_caption_shards"]

#: The shapes' colours (the zero-shot classes of the demo).
CAPTION_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 190, 40),
    "blue": (40, 60, 220),
    "yellow": (235, 220, 40),
    "magenta": (210, 40, 200),
}


def caption_scene(rng: np.random.Generator, width: int, height: int) -> tuple[Image.Image, str, str]:
    """One scene: the image, its caption and its colour's name."""
    grey = np.asarray(photo_like_image(rng, width, height, float(rng.random())).convert("L"))
    dark = bool(grey.mean() < 128)
    image = Image.fromarray(np.stack([grey] * 3, axis=-1))
    colour = list(CAPTION_COLOURS)[int(rng.integers(len(CAPTION_COLOURS)))]
    shape = "square" if rng.random() < 0.5 else "disc"
    side = int(min(width, height) * rng.uniform(0.45, 0.75))
    x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
    draw = ImageDraw.Draw(image)
    (draw.rectangle if shape == "square" else draw.ellipse)([x, y, x + side - 1, y + side - 1], CAPTION_COLOURS[colour])
    return image, f"a {colour} {shape} on a {'dark' if dark else 'light'} photo", colour


def make_caption_shards(
    root: str | Path,
    count: int = 200,
    per_shard: int = 50,
    size: tuple[int, int] = (160, 120),
    seed: int = 0,
    val_fraction: float = 0.2,
) -> Path:
    """Write ``count`` captioned scenes as tar shards in ``root/train`` and ``root/val`` (the last ``val_fraction``).

    Each shard is written under a temporary name and renamed when whole. Returns ``root``.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    n_val = max(1, int(round(count * val_fraction)))
    splits = {"train": range(count - n_val), "val": range(count - n_val, count)}
    for split, keys in splits.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        for s in range(0, len(keys), per_shard):
            path = root / split / f"{s // per_shard:05d}.tar"
            with tarfile.open(f"{path}.tmp", "w") as tf:
                for k in keys[s : s + per_shard]:
                    w, h = int(size[0] * rng.uniform(0.85, 1.0)), int(size[1] * rng.uniform(0.85, 1.0))
                    image, caption, _ = caption_scene(rng, w, h)
                    out = io.BytesIO()
                    image.save(out, "JPEG", quality=90)
                    meta = {"caption": caption, "url": f"https://example.com/{k}.jpg", "width": w, "height": h}
                    members = {"txt": caption.encode(), "json": json.dumps(meta).encode()}
                    if k % 25 != 24:  # every 25th download failed: no image
                        members = {"jpg": out.getvalue(), **members}
                    for ext, data in members.items():
                        info = tarfile.TarInfo(f"{k:09d}.{ext}")
                        info.size = len(data)
                        tf.addfile(info, io.BytesIO(data))
            os.replace(f"{path}.tmp", path)
    return root
