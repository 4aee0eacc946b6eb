"""Where a detection split's images and annotations are, as each layout ships, and what its categories are.

- ``coco``: ``<split>/`` images (``train2017/``), ``annotations/instances_<split>.json`` (or ``annotation_file=``):
  read once per split, each image's boxes kept with it (XYWH made XYXY; an image without a box is a background);
  the categories are the file's, sorted by id (its sparse ids mapped to contiguous labels and back).
- ``voc``: ``JPEGImages/<id>.jpg``, ``Annotations/<id>.xml`` (read with each image), ``ImageSets/Main/<split>.txt``;
  the 20 VOC classes unless ``class_names=``.
- ``yolo``: ``images/<split>/**``, ``labels/<split>/**/<stem>.txt`` (read once per split; an image without one is a
  background), ``data.yaml``'s ``names`` (else ``class_names=``, else numbers).
- ``csv``: ``<split>.csv`` of boxes, a row each, ``image,xmin,ymin,xmax,ymax,label`` (the image's path under the
  root, the box in its pixels, the class's name; a row with empty box fields lists an image without a box); the
  classes are the training CSV's labels, sorted (else ``class_names=``).

``"auto"`` tells them by the root's top folders (a ``train.csv`` beside them: ``csv``). A folder or a bucket (the
package's storage) alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.storage.base import join_url
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.sources.folder import FolderPairs

__all__ = ["DETECTION_LAYOUTS", "VOC_CLASSES", "DetectionLayout", "DetectionLayoutName", "detect_detection_layout"]

DetectionLayoutName = Literal["auto", "coco", "voc", "yolo", "csv", "shards", "parquet", "hdf5"]
#: The layouts ``layout=`` takes.
DETECTION_LAYOUTS = ("auto", "coco", "voc", "yolo", "csv")
#: A CSV of boxes' columns, in order.
CSV_COLUMNS = ("image", "xmin", "ymin", "xmax", "ymax", "label")
#: Pascal VOC's 20 classes, in its order.
VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable", "dog",
    "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip


def _join(root: str, *parts: str) -> str:
    return join_url(root, "/".join(p.strip("/") for p in parts if p.strip("/")))


def _read(root: str, rel: str, options: Mapping[str, Any] | None, what: str) -> bytes:
    data = next(iter(open_storage(root, options).read_many([rel])))
    if isinstance(data, OSError):
        raise PathNotFoundError(f"{_join(root, rel)} does not exist: {what}.")
    return data


def _images(root: str, options: Mapping[str, Any] | None) -> list[str]:
    try:
        index = open_storage(root, options).list_images()
    except FileNotFoundError as err:
        raise PathNotFoundError(f"{root} holds no image ({err}).") from None
    return sorted(index.relpath(i) for i in range(len(index)))


def detect_detection_layout(root: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """The layout of ``root`` by its top folders (module docstring).

    Raises:
        FileNotFoundError: If none fits (the folders found named).
    """
    try:
        top = set(open_storage(root, storage_options).list_classes())
    except FileNotFoundError:
        top = set()
    if {"JPEGImages", "Annotations"} <= top:
        return "voc"
    if {"images", "labels"} <= top:
        return "yolo"
    if "annotations" in top:
        return "coco"
    if not isinstance(next(iter(open_storage(root, storage_options).read_many(["train.csv"]))), OSError):
        return "csv"
    raise PathNotFoundError(
        f"{root} is not a detection layout this package knows (its folders: {sorted(top) or 'none'}): COCO "
        "(annotations/instances_<split>.json beside <split>/), VOC (JPEGImages, Annotations, ImageSets/Main), YOLO "
        "(images/<split>, labels/<split>, data.yaml) or a CSV of boxes (train.csv: image,xmin,ymin,xmax,ymax,label). "
        "Give layout=."
    )


@dataclass(frozen=True)
class DetectionLayout:
    """A detection folder layout: its pairs (:data:`~lightning_fastdata.sources.folder.FolderLayout`) and categories.

    Attributes:
        layout: ``"auto"``, ``"coco"``, ``"voc"`` or ``"yolo"``.
        annotation_file: COCO: the split's annotation file under the root (default
            ``annotations/instances_<split>.json``).
        class_names: The classes in label order (VOC: its 20 by default; YOLO: ``data.yaml``'s); COCO's come from
            its file, and these, if given, must be its categories' names.
    """

    layout: str = "auto"
    annotation_file: str | None = None
    class_names: tuple[str, ...] | None = None
    #: The COCO file :meth:`categories` read, kept for the pairs of the same split (read once, dropped once used).
    _read_doc: dict[tuple[str, str], dict] = field(default_factory=dict, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_read_doc": {}}  # a kept file never crosses a process

    def found(self, root: str, options: Mapping[str, Any] | None) -> str:
        """The layout read (``"auto"`` resolved)."""
        if self.layout not in DETECTION_LAYOUTS:
            raise InvalidValueError(f"layout should be one of {', '.join(map(repr, DETECTION_LAYOUTS))}, got "
                                    f"{self.layout!r}.")  # fmt: skip
        return detect_detection_layout(root, options) if self.layout == "auto" else self.layout

    def __call__(self, root: str, split: str, storage_options: Mapping[str, Any] | None) -> FolderPairs:
        """The split's images and annotations (module docstring)."""
        found = self.found(root, storage_options)
        if found == "coco":
            return self._coco(root, split, storage_options)
        if found == "voc":
            return self._voc(root, split, storage_options)
        if found == "csv":
            return self._csv(root, split, storage_options)
        return self._yolo(root, split, storage_options)

    def categories(self, root: str, split: str, options: Mapping[str, Any] | None) -> tuple[tuple[str, ...], dict]:
        """The class names in label order, and each raw category (COCO id, VOC name, YOLO index) -> its label.

        Raises:
            ValueError: If ``class_names`` disagree with a COCO file's categories.
        """
        found = self.found(root, options)
        if found == "coco":
            doc = self._coco_file(root, split, options)
            self._read_doc.clear()
            self._read_doc[(root, split)] = doc  # the split's pairs come next: the file is not read again
            cats = sorted(doc.get("categories", []), key=lambda c: int(c["id"]))
            names = tuple(str(c["name"]) for c in cats)
            if self.class_names is not None and tuple(self.class_names) != names:
                raise InvalidValueError(
                    f"class_names={list(self.class_names)!r} are not the categories of {self._coco_rel(split)} "
                    f"({list(names)[:6]} ...): leave class_names out for COCO (its file names them)."
                )
            return names, {int(c["id"]): k for k, c in enumerate(cats)}
        if found == "voc":
            names = tuple(self.class_names or VOC_CLASSES)
            return names, {n: k for k, n in enumerate(names)}
        if found == "csv":
            names = self.class_names or tuple(sorted({str(r[5]) for r in self._csv_rows(root, split, options) if r[5]}))
            return tuple(names), {n: k for k, n in enumerate(names)}
        names = tuple(self.class_names) if self.class_names is not None else self._yolo_names(root, options)
        return names, dict(enumerate(range(len(names))))

    # -- COCO ---------------------------------------------------------------------------------------------
    def _coco_rel(self, split: str) -> str:
        return self.annotation_file or f"annotations/instances_{split}.json"

    def _coco_file(self, root: str, split: str, options: Mapping[str, Any] | None) -> dict:
        kept = self._read_doc.pop((root, split), None)
        if kept is not None:
            return kept
        data = _read(root, self._coco_rel(split), options, "a COCO split's annotations (or give annotation_file=)")
        try:
            return json.loads(data)
        except ValueError as err:
            raise DataError(f"{_join(root, self._coco_rel(split))} is not readable JSON ({err}).") from None

    def _coco(self, root: str, split: str, options: Mapping[str, Any] | None) -> FolderPairs:
        doc = self._coco_file(root, split, options)
        rel = self._coco_rel(split)
        images = {int(im["id"]): im for im in doc.get("images", [])}
        boxes: dict[int, list[Any]] = {i: [] for i in images}
        for ann in doc.get("annotations", []):
            if int(ann["image_id"]) not in images:
                raise DataError(f"{_join(root, rel)}: annotation {ann.get('id')} names image {ann['image_id']}, "
                                "which the file does not list.")  # fmt: skip
            boxes[int(ann["image_id"])].append(ann)
        listed = set(_images(_join(root, split), options))
        files, payloads, inline = [], [], []
        for image_id in sorted(images):
            name = str(images[image_id]["file_name"])
            if name not in listed:
                raise PathNotFoundError(f"{_join(root, rel)} names image {image_id} {name!r}, which "
                                        f"{_join(root, split)} does not hold.")  # fmt: skip
            anns = boxes[image_id]
            xywh = np.asarray([a["bbox"] for a in anns], np.float32).reshape(-1, 4)
            inline.append({
                "boxes": np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1),
                "categories": [int(a["category_id"]) for a in anns],
                "iscrowd": np.asarray([int(a.get("iscrowd", 0)) for a in anns], np.uint8),
                "difficult": np.zeros(len(anns), np.uint8), "normalized": False, "image_id": image_id,
                "segmentation": [a.get("segmentation") for a in anns],
                "size": (int(images[image_id].get("width") or 0), int(images[image_id].get("height") or 0)),
            })  # fmt: skip
            files.append(f"{split}/{name}")
            payloads.append(f"{rel}#image {image_id}")
        return FolderPairs("coco", tuple(files), tuple(payloads), tuple(inline), (rel,))

    # -- VOC ----------------------------------------------------------------------------------------------
    def _voc(self, root: str, split: str, options: Mapping[str, Any] | None) -> FolderPairs:
        listing = f"ImageSets/Main/{split}.txt"
        ids = _read(root, listing, options, "a VOC folder lists each split's ids there").decode().split()
        if not ids:
            raise InvalidValueError(f"{_join(root, listing)} lists no id.")
        have = set(_images(_join(root, "JPEGImages"), options))
        missing = [i for i in ids if f"{i}.jpg" not in have]
        if missing:
            raise PathNotFoundError(f"{_join(root, listing)} names {missing[0]!r}, whose image "
                                    f"{_join(root, 'JPEGImages', missing[0] + '.jpg')} does not exist.")  # fmt: skip
        return FolderPairs("voc", tuple(f"JPEGImages/{i}.jpg" for i in ids), tuple(f"Annotations/{i}.xml" for i in ids))

    # -- CSV ----------------------------------------------------------------------------------------------
    def _csv_rows(self, root: str, split: str, options: Mapping[str, Any] | None) -> list[list[str]]:
        """The split's CSV rows (its header checked: :data:`CSV_COLUMNS`)."""
        import csv
        import io

        rel = f"{split}.csv"
        text = _read(root, rel, options, "a CSV of boxes per split (image,xmin,ymin,xmax,ymax,label)")
        rows = list(csv.reader(io.StringIO(text.decode("utf-8-sig"))))
        if not rows or tuple(c.strip() for c in rows[0]) != CSV_COLUMNS:
            raise DataError(f"{_join(root, rel)}: its header should be {','.join(CSV_COLUMNS)}, got "
                            f"{','.join(rows[0]) if rows else 'nothing'}.")  # fmt: skip
        bad = next((k for k, r in enumerate(rows[1:], 2) if len(r) != len(CSV_COLUMNS)), None)
        if bad is not None:
            raise DataError(f"{_join(root, rel)}: line {bad} has {len(rows[bad - 1])} fields, not 6.")
        return [[c.strip() for c in r] for r in rows[1:]]

    def _csv(self, root: str, split: str, options: Mapping[str, Any] | None) -> FolderPairs:
        rel = f"{split}.csv"
        per_image: dict[str, list[list[str]]] = {}
        for line, row in enumerate(self._csv_rows(root, split, options), 2):
            boxes = per_image.setdefault(row[0], [])
            if any(row[1:]):
                try:
                    [float(v) for v in row[1:5]]
                except ValueError:
                    raise DataError(f"{_join(root, rel)}: line {line} has a box that is not four numbers: "
                                    f"{row[1:5]}.") from None  # fmt: skip
                boxes.append(row)
        have = set(_images(root, options))
        missing = [name for name in per_image if name not in have]
        if missing:
            raise PathNotFoundError(f"{_join(root, rel)} names {missing[0]!r}, which {root} does not hold.")
        inline = []
        for rows in per_image.values():
            n = len(rows)
            inline.append({"boxes": np.asarray([[float(v) for v in r[1:5]] for r in rows], np.float32).reshape(-1, 4),
                           "categories": [r[5] for r in rows], "iscrowd": np.zeros(n, np.uint8),
                           "difficult": np.zeros(n, np.uint8), "normalized": False})  # fmt: skip
        files = tuple(per_image)
        return FolderPairs("csv", files, tuple(f"{rel}#{name}" for name in files), tuple(inline), (rel,))

    # -- YOLO ---------------------------------------------------------------------------------------------
    def _yolo_names(self, root: str, options: Mapping[str, Any] | None) -> tuple[str, ...]:
        import yaml

        data = next(iter(open_storage(root, options).read_many(["data.yaml"])))
        if isinstance(data, OSError):
            raise InvalidValueError(f"{root} has no data.yaml naming its classes: give class_names=.")
        names = (yaml.safe_load(data) or {}).get("names")
        if isinstance(names, dict):
            names = [names[k] for k in sorted(names)]
        if not isinstance(names, list) or not names:
            raise InvalidValueError(f"{_join(root, 'data.yaml')} has no list of names: give class_names=.")
        return tuple(str(n) for n in names)

    def _yolo(self, root: str, split: str, options: Mapping[str, Any] | None) -> FolderPairs:
        images = _images(_join(root, "images", split), options)
        labels = [f"labels/{split}/{rel.rsplit('.', 1)[0]}.txt" for rel in images]
        read = open_storage(root, options).read_many(labels)
        inline = [b"" if isinstance(data, FileNotFoundError) else data for data in read]  # none: a background
        for rel, data in zip(labels, inline):
            if isinstance(data, OSError):
                raise DataError(f"Cannot read {_join(root, rel)}: {data}.") from data
        files = tuple(f"images/{split}/{rel}" for rel in images)
        return FolderPairs("yolo", files, tuple(labels), tuple(inline), ())
