"""Image-caption pairs whose images encode their ids (solid colours 40 levels apart per channel: a JPEG, a crop and
a resize keep them) and whose captions name those ids: a caption paired with another sample's image is caught."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def colour(k: int) -> tuple[int, int, int]:
    return (20 + 40 * (k % 6), 20 + 40 * ((k // 6) % 6), 20 + 40 * (k // 36))


def id_of(image: torch.Tensor) -> int:
    """The id a rendered image's colour encodes (its mean, to the nearest level)."""
    r, g, b = (int(round((float(c) - 20) / 40)) for c in image.float().mean(dim=(1, 2)))
    return r + 6 * g + 36 * b


def jpeg(k: int, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour(k)).save(out, "JPEG", quality=95)
    return out.getvalue()


def write_shards(root: Path, count: int, per_shard: int, json_captions: bool = False) -> dict[str, int]:
    """img2dataset's layout: ``key.jpg``, ``key.txt``, ``key.json``; key 3 lost its image, key 5 its caption."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(0, count, per_shard):
        with tarfile.open(root / f"{s // per_shard:05d}.tar", "w") as tf:
            for k in range(s, min(count, s + per_shard)):
                size = (int(rng.integers(60, 120)), int(rng.integers(60, 120)))
                caption = f"a photo of image {k}"
                meta = {"caption": [f"image {k}, caption {j}" for j in range(3)] if json_captions else caption,
                        "url": f"http://example.com/{k}.jpg", "width": size[0], "height": size[1]}  # fmt: skip
                members = {"json": json.dumps(meta).encode()}
                if k != 3:
                    members["jpg"] = jpeg(k, size)
                if k != 5:
                    members["txt"] = caption.encode()
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{k:09d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return {"count": count - 2}


def caption_id(text: str) -> int:
    return int(text.split("image ")[1].split(",")[0])


def paired_ids(batches: list) -> list[int]:
    """The ids the ``(images, texts)`` batches' captions name, each checked against its image's colour."""
    ids = []
    for images, texts in batches:
        for image, text in zip(images, texts):
            assert id_of(image) == caption_id(text), text
            ids.append(caption_id(text))
    return ids
