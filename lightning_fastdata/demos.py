"""Demo data: photo-like JPEG folders for the demo, the benchmark, notebooks and tests. No download.

Like ``lightning.pytorch.demos``: everything that makes data to show the package with lives here, and it never
writes into a folder it did not create (:func:`ensure_demo_data`).
"""

from __future__ import annotations

import colorsys
import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from lightning_fastdata.errors import NotAFolderError, PathExistsError
from lightning_fastdata.loading.atomic import atomic_write_bytes

__all__ = ["ensure_demo_data", "make_image_folder", "photo_like_image"]

_DONE = ".complete"
_GENERATING = ".fastdata-generating"


def photo_like_image(rng: np.random.Generator, width: int, height: int, hue: float) -> Image.Image:
    """Return an RGB image whose JPEG behaves like a photo's: smooth shapes, texture and sensor grain.

    At 500x375 and quality 90 it encodes to ~100 KB, like an ImageNet photo, so decode costs are realistic.
    The dominant colour follows ``hue`` (0..1), which makes classes learnable in a few steps.
    """
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.zeros((height, width, 3), np.float32)
    for _ in range(5):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(30, 200)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[..., None]
        img += blob * rng.uniform(0, 255, 3).astype(np.float32)
    base = np.array(colorsys.hsv_to_rgb(hue, 0.8, 220.0), np.float32)
    img = 0.4 * img + 0.6 * base
    coarse = rng.normal(0, 45, (height // 8 + 1, width // 8 + 1, 3)).astype(np.float32)
    img += np.kron(coarse, np.ones((8, 8, 1), np.float32))[:height, :width]
    img += rng.normal(0, 20, (height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _write_class(args: tuple[str, int, int, int, tuple[int, int], int, int, str]) -> int:
    root, label, num_classes, count, size, quality, seed, ext = args
    rng = np.random.default_rng([seed, label])
    folder = Path(root) / f"class_{label:03d}"
    folder.mkdir(parents=True, exist_ok=True)
    hue = label / num_classes
    for i in range(count):
        w = int(size[0] * rng.uniform(0.85, 1.0))
        h = int(size[1] * rng.uniform(0.85, 1.0))
        if rng.random() < 0.2:
            w, h = h, w  # some portrait images, as in real photo sets
        buf = io.BytesIO()
        fmt = "JPEG" if ext in (".jpg", ".jpeg") else ext.lstrip(".").upper()
        photo_like_image(rng, w, h, hue).save(buf, fmt, **({"quality": quality} if fmt == "JPEG" else {}))
        atomic_write_bytes(folder / f"img_{i:06d}{ext}", buf.getvalue(), fsync=False)  # generated data
    return count


def make_image_folder(
    root: str | os.PathLike[str],
    num_classes: int = 4,
    per_class: int = 10,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    seed: int = 0,
    ext: str = ".jpg",
    processes: int = 1,
) -> Path:
    """Write ``num_classes x per_class`` photo-like images under ``root/class_XXX/img_XXXXXX.jpg``.

    Sizes vary between 85% and 100% of ``size`` (width, height), a fifth are portrait. Each file is written
    under a temporary name and renamed, so an interrupted run leaves no half-written image.

    Returns:
        ``root`` as a ``Path``.
    """
    root = Path(root)
    jobs = [(str(root), c, num_classes, per_class, size, quality, seed, ext) for c in range(num_classes)]
    if processes > 1:
        with ProcessPoolExecutor(processes) as pool:
            list(pool.map(_write_class, jobs))
    else:
        for job in jobs:
            _write_class(job)
    return root


def ensure_demo_data(
    root: str, num_classes: int = 8, per_class: int = 64, processes: int = 2, use_existing: bool = True
) -> Path:
    """Generate the demo's photo-like JPEG folder at ``root``, only where that cannot touch anyone's data.

    Generates into a folder that does not exist or is empty (marked as ours first; a marker written last says
    it is complete, so an interrupted run regenerates next time). A non-empty folder the package did not
    create is never written to: it is used as it is (``use_existing``, e.g. benchmarking your own images) or
    refused.

    Raises:
        FileExistsError: If ``root`` is a non-empty folder the package did not create and ``use_existing`` is off.
        NotADirectoryError: If ``root`` is a file.
    """
    path = Path(root)
    if (path / _DONE).exists():
        return path
    if path.exists() and not path.is_dir():
        raise NotAFolderError(f"{str(path)!r} is a file; pass a folder to generate the images in.")
    ours = (path / _GENERATING).exists()
    if path.exists() and not ours and any(path.iterdir()):
        if use_existing:
            print(f"fastdata: using the existing folder {path} as it is (read-only; nothing is generated in it).")
            return path
        raise PathExistsError(
            f"{str(path)!r} exists and is not empty; fastdata never writes into a folder it did not create. "
            "Choose a new or empty folder."
        )
    print(f"fastdata: generating {num_classes * per_class} photo-like JPEGs (~500x375, q90) in {path} ...")
    path.mkdir(parents=True, exist_ok=True)
    (path / _GENERATING).write_text("generated by fastdata; incomplete until .complete exists\n")
    make_image_folder(path, num_classes=num_classes, per_class=per_class, processes=processes)
    (path / _DONE).write_text("ok\n")
    (path / _GENERATING).unlink()
    return path
