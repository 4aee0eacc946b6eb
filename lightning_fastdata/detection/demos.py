"""Detection demo data: scenes of coloured rectangles whose colour is their class, in COCO's, VOC's or YOLO's layout.

Each scene is a grey photo-like background with 1-5 rectangles, 6 pixels apart at least, each filled with its class's
colour (the segmentation demo's colours), so a
test can check that a box still frames its class's pixels after any window: inside a box, away from its edges, the
pixels are its colour, and every pixel of a colour lies in a box of that class. COCO's categories get sparse ids
(1, 3, 5, ...) as COCO's own do, so their mapping to contiguous labels is exercised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from lightning_fastdata.demos import photo_like_image
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.segmentation.demos import SEGMENTATION_COLOURS

__all__ = ["DETECTION_CLASSES", "coco_category_ids", "detection_scene", "make_detection_folder"]

#: The demo's classes in label order (a rectangle's colour).
DETECTION_CLASSES = ("red", "green", "blue", "yellow", "magenta")


def coco_category_ids() -> list[int]:
    """The demo's COCO category ids, sparse as COCO's (label ``k`` is id ``2 k + 1``)."""
    return [2 * k + 1 for k in range(len(DETECTION_CLASSES))]


def detection_scene(rng: np.random.Generator, width: int, height: int) -> tuple[Image.Image, np.ndarray, np.ndarray]:
    """One scene: the image, its boxes (``n x 4`` XYXY pixel edges, integers) and their labels."""
    grey = np.asarray(photo_like_image(rng, width, height, float(rng.random())).convert("L"))
    image = Image.fromarray(np.stack([grey] * 3, axis=-1))
    paint = ImageDraw.Draw(image)
    boxes: list[list[int]] = []
    labels: list[int] = []
    for _ in range(int(rng.integers(1, 6))):
        for _try in range(20):  # a place at least 6 pixels from every earlier box (the JPEG's colours bleed a pixel)
            w, h = int(rng.uniform(0.12, 0.4) * width), int(rng.uniform(0.12, 0.4) * height)
            x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
            if all(x + w + 6 <= b[0] or b[2] + 6 <= x or y + h + 6 <= b[1] or b[3] + 6 <= y for b in boxes):
                break
        else:
            continue
        label = int(rng.integers(len(DETECTION_CLASSES)))
        paint.rectangle([x, y, x + w - 1, y + h - 1], fill=tuple(int(v) for v in SEGMENTATION_COLOURS[label + 1]))
        boxes.append([x, y, x + w, y + h])
        labels.append(label)
    return image, np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels, np.int64)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text, fsync=False)


def make_detection_folder(
    root: str | Path,
    count: int = 20,
    size: tuple[int, int] = (160, 120),
    layout: Literal["coco", "voc", "yolo"] = "coco",
    seed: int = 0,
    val_fraction: float = 0.25,
    portrait: float = 0.0,
) -> Path:
    """Write ``count`` scenes in ``layout``'s folders, the last ``val_fraction`` the validation split.

    COCO: ``train2017/``, ``val2017/``, ``annotations/instances_<split>.json``; VOC: ``JPEGImages``,
    ``Annotations``, ``ImageSets/Main/{train,val}.txt`` (class names: :data:`DETECTION_CLASSES`); YOLO:
    ``images/{train,val}``, ``labels/{train,val}``, ``data.yaml``. Sizes vary between 85% and 100% of ``size``;
    a ``portrait`` fraction of the scenes (drawn at random) is ``size`` turned (height x width).
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    n_val = max(1, int(round(count * val_fraction)))
    splits = {"train": range(count - n_val), "val": range(count - n_val, count)}
    coco_split = {"train": "train2017", "val": "val2017"}
    for split, ids in splits.items():
        coco: dict = {"images": [], "annotations": [], "categories": [
            {"id": i, "name": n} for i, n in zip(coco_category_ids(), DETECTION_CLASSES)]}  # fmt: skip
        listed = []
        for i in ids:
            w, h = (int(s * rng.uniform(0.85, 1.0)) for s in size)
            if portrait and rng.random() < portrait:
                w, h = h, w
            image, boxes, labels = detection_scene(rng, w, h)
            name = f"scene_{i:06d}"
            if layout == "coco":
                path = root / coco_split[split] / f"{name}.jpg"
                coco["images"].append({"id": i + 1, "file_name": f"{name}.jpg", "width": w, "height": h})
                for b, lab in zip(boxes.tolist(), labels.tolist()):
                    coco["annotations"].append({
                        "id": len(coco["annotations"]) + 1 + 10_000 * i, "image_id": i + 1, "iscrowd": 0,
                        "category_id": coco_category_ids()[lab], "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                        "area": (b[2] - b[0]) * (b[3] - b[1]),
                        "segmentation": [[b[0], b[1], b[2], b[1], b[2], b[3], b[0], b[3]]],
                    })  # fmt: skip
            elif layout == "voc":
                path = root / "JPEGImages" / f"{name}.jpg"
                objects = "".join(
                    f"<object><name>{DETECTION_CLASSES[lab]}</name><difficult>0</difficult><bndbox><xmin>{b[0] + 1:g}"
                    f"</xmin><ymin>{b[1] + 1:g}</ymin><xmax>{b[2]:g}</xmax><ymax>{b[3]:g}</ymax></bndbox></object>"
                    for b, lab in zip(boxes.tolist(), labels.tolist())
                )
                size_xml = f"<size><width>{w}</width><height>{h}</height></size>"
                _write(root / "Annotations" / f"{name}.xml", f"<annotation>{size_xml}{objects}</annotation>")
                listed.append(name)
            else:
                path = root / "images" / split / f"{name}.jpg"
                lines = [
                    f"{lab} {(b[0] + b[2]) / 2 / w:.6f} {(b[1] + b[3]) / 2 / h:.6f} {(b[2] - b[0]) / w:.6f} "
                    f"{(b[3] - b[1]) / h:.6f}"
                    for b, lab in zip(boxes.tolist(), labels.tolist())
                ]
                if lines:
                    _write(root / "labels" / split / f"{name}.txt", "\n".join(lines) + "\n")
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path, quality=92)
        if layout == "coco":
            _write(root / "annotations" / f"instances_{coco_split[split]}.json", json.dumps(coco))
        elif layout == "voc":
            _write(root / "ImageSets" / "Main" / f"{split}.txt", "\n".join(listed) + "\n")
    if layout == "yolo":
        _write(root / "data.yaml", json.dumps({"names": list(DETECTION_CLASSES)}))
    return root
