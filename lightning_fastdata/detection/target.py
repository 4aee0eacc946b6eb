"""``BoxTarget``: boxes and their classes, the target kind of object detection.

A sample's boxes come from its annotation (a COCO file's part for the image, a VOC XML file, a YOLO text file, a
JSON member or cell: :func:`decode_annotation`) as XYXY pixel edges of the image as stored, each with its category (a
COCO id, a VOC name, a YOLO index, mapped to the module's contiguous labels by ``categories``) and its ``iscrowd``
flag. They follow the image's :class:`~lightning_fastdata.sources.window.Window` exactly: the same linear map of the
source region onto its place (and the same mirror) the decoder applies to the pixels, then clamped to the place and
sanitized as torchvision's ``SanitizeBoundingBoxes`` does (a box under one pixel wide or high dropped, its label and
flags with it). A batch's boxes travel packed (:class:`BoxBatch`: every box of the batch in one tensor, a count per
image) and become torchvision's list of target dicts on the device.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Self

import numpy as np
import torch

from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.window import Window, pixel_centres
from lightning_fastdata.sources.windowed import padded_batch

__all__ = ["BoxBatch", "BoxTarget", "Boxes", "PaddedBoxes", "decode_annotation"]

#: A decoded annotation, a dict of ``boxes`` (``n x 4`` float32 XYXY), ``categories`` (raw COCO ids, VOC names or YOLO
#: indices), ``iscrowd`` (``n`` uint8), ``difficult`` (``n`` uint8, VOC's) and ``normalized`` (YOLO's 0-1 coordinates).
Boxes = dict[str, Any]

#: A box as the decoded cache keeps it.
_STORED = np.dtype([("box", "<f4", (4,)), ("label", "<i4"), ("crowd", "u1")])
#: What the decoded cache keeps of an image before its boxes.
_HEADER = np.dtype([("image_id", "<i8"), ("orig", "<i4", (2,)), ("count", "<i4")])


def _empty(normalized: bool = False) -> Boxes:
    return {
        "boxes": np.zeros((0, 4), np.float32), "categories": [], "iscrowd": np.zeros(0, np.uint8),
        "difficult": np.zeros(0, np.uint8), "normalized": normalized,
    }  # fmt: skip


def _voc(data: bytes, name: str) -> Boxes:
    """A VOC XML annotation: each ``object``'s ``name`` and ``bndbox`` (1-based pixel indices: edges ``xmin - 1``)."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise DataError(f"{name} is not a readable VOC annotation ({err}).") from None
    boxes, names, difficult = [], [], []
    for obj in root.iter("object"):
        box = obj.find("bndbox")
        if box is None or obj.findtext("name") is None:
            raise DataError(f"{name}: an object without a name or a bndbox.")
        edges = [float(box.findtext(k) or "nan") for k in ("xmin", "ymin", "xmax", "ymax")]
        boxes.append([edges[0] - 1, edges[1] - 1, edges[2], edges[3]])
        names.append(str(obj.findtext("name")).strip())
        difficult.append(int(obj.findtext("difficult") or 0))
    out = _empty()
    size = root.find("size")
    if size is not None:  # what the annotation says of its image (checked against the file)
        out["size"] = (int(float(size.findtext("width") or 0)), int(float(size.findtext("height") or 0)))
    if boxes:
        out.update(boxes=np.asarray(boxes, np.float32), categories=names, iscrowd=np.zeros(len(boxes), np.uint8),
                   difficult=np.asarray(difficult, np.uint8))  # fmt: skip
    return out


def _yolo(data: bytes, name: str) -> Boxes:
    """A YOLO label file: a line ``class cx cy w h`` per box, 0-1 of the image's size."""
    rows = [line.split() for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]
    if any(len(r) != 5 for r in rows):
        raise DataError(f"{name}: a YOLO label line is 'class cx cy w h' (five numbers).")
    out = _empty(normalized=True)
    if not rows:
        return out
    values = np.asarray([[float(v) for v in r[1:]] for r in rows], np.float32)
    if (values < 0).any() or (values > 1).any():
        row = int(np.flatnonzero(((values < 0) | (values > 1)).any(axis=1))[0])
        raise DataError(f"{name}: line {row + 1} holds a value outside 0..1 (YOLO's coordinates are fractions).")
    cx, cy, w, h = values.T
    out.update(boxes=np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(np.float32),
               categories=[int(r[0]) for r in rows], iscrowd=np.zeros(len(rows), np.uint8),
               difficult=np.zeros(len(rows), np.uint8))  # fmt: skip
    return out


def _json(data: bytes, name: str) -> Boxes:
    """Our JSON annotation: ``{"boxes": [[x1, y1, x2, y2], ...], "categories": [...], "iscrowd": [...]}``."""
    try:
        doc = json.loads(data)
        boxes = np.asarray(doc.get("boxes", []), np.float32).reshape(-1, 4)
    except (ValueError, TypeError, AttributeError) as err:
        raise DataError(f"{name} is not a readable box annotation ({err}).") from None
    out = _empty()
    n = len(boxes)
    out.update(boxes=boxes, categories=list(doc.get("categories", [])),
               iscrowd=np.asarray(doc.get("iscrowd", [0] * n), np.uint8),
               difficult=np.asarray(doc.get("difficult", [0] * n), np.uint8),
               segmentation=doc.get("segmentation"), image_id=int(doc.get("image_id", -1)))  # fmt: skip
    if len(out["categories"]) != n:
        raise DataError(f"{name}: {n} boxes and {len(out['categories'])} categories.")
    return out


def _hub_objects(objects: dict[str, Any], name: str) -> Boxes:
    """The hubs' ``objects`` column's row, as their detection sets and object-detection guide lay it out.

    ``bbox``: COCO's ``[x, y, width, height]`` each; ``category``: each box's class.
    """
    try:
        xywh = np.asarray(objects.get("bbox") or [], np.float32).reshape(-1, 4)
    except (ValueError, TypeError) as err:
        raise DataError(f"{name}: its objects' bbox is not a list of [x, y, width, height] ({err}).") from None
    categories = list(objects.get("category") or [])
    if len(categories) != len(xywh):
        raise DataError(f"{name}: {len(xywh)} boxes and {len(categories)} categories in its objects.")
    out = _empty()
    crowd = objects.get("iscrowd") or [0] * len(xywh)
    out.update(boxes=np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1), categories=categories,
               iscrowd=np.asarray(crowd, np.uint8), difficult=np.zeros(len(xywh), np.uint8))  # fmt: skip
    return out


def decode_annotation(payload: Any, name: str) -> Boxes:
    """An annotation as :data:`Boxes`, from whatever form it came in.

    A decoded one as it is, the hubs' ``objects`` row (a dict with ``bbox`` and ``category``), else VOC XML, our
    JSON or YOLO text by its bytes.

    Raises:
        DataError: For an annotation it cannot read (named).
    """
    if isinstance(payload, dict):
        return _hub_objects(payload, name) if "bbox" in payload else payload
    data = payload.encode() if isinstance(payload, str) else bytes(payload)  # an HDF5 string, bytes, a uint8 array
    head = data.lstrip()[:1]
    if head == b"<":
        return _voc(data, name)
    if head == b"{":
        return _json(data, name)
    return _yolo(data, name)


def _rasterized(segmentation: Sequence[Any], height: int, width: int, name: str) -> np.ndarray:
    """Each box's COCO segmentation (polygons, or RLE compressed or not) as a ``height x width`` 0/1 mask.

    As torchvision's detection reference (``ConvertCocoPolysToMask``): pycocotools' ``frPyObjects`` and ``decode``,
    a mask of several polygons their union.

    Raises:
        DataError: For a segmentation that is none of those, or an RLE of another size (named).
        ModuleNotFoundError: Without pycocotools (named).
    """
    try:
        from pycocotools import mask as coco_mask
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("masks=True decodes COCO's polygons and RLE with pycocotools: pip install "
                                  "pycocotools") from err  # fmt: skip
    out = np.zeros((len(segmentation), height, width), np.uint8)
    for k, seg in enumerate(segmentation):
        if isinstance(seg, dict) and isinstance(seg.get("counts"), str):
            seg = {**seg, "counts": seg["counts"].encode()}
        try:
            if isinstance(seg, dict) and isinstance(seg.get("counts"), bytes):
                decoded = coco_mask.decode(seg)
            elif isinstance(seg, (list, dict)) and seg:
                decoded = coco_mask.decode(coco_mask.frPyObjects(seg, height, width))
            else:
                raise TypeError("no polygon or RLE")
        except (TypeError, ValueError, KeyError, IndexError) as err:
            raise DataError(f"{name}: box {k}'s segmentation is not COCO's polygons or RLE ({err}).") from None
        decoded = decoded.reshape(decoded.shape[0], decoded.shape[1], -1)
        if decoded.shape[:2] != (height, width):
            raise DataError(f"{name}: box {k}'s RLE is {decoded.shape[1]}x{decoded.shape[0]}, its image "
                            f"{width}x{height}.")  # fmt: skip
        out[k] = decoded.any(axis=2)
    return out


class BoxBatch(NamedTuple):
    """A batch's boxes, packed to cross processes as tensors: image ``k``'s are ``counts[k]`` rows in order.

    ``sizes``: each image's ``(height, width)`` as rendered, at the padded batch's top left; ``masks``: each box's
    instance mask (``masks=True``: ``total x H x W`` uint8 at the padded batch's size; else ``0 x 0 x 0``).
    """

    boxes: torch.Tensor
    labels: torch.Tensor
    iscrowd: torch.Tensor
    counts: torch.Tensor
    sizes: torch.Tensor
    masks: torch.Tensor
    image_ids: torch.Tensor
    orig_sizes: torch.Tensor

    def targets(self) -> list[dict[str, torch.Tensor]]:
        """The detection targets torchvision takes: a dict per image.

        ``boxes`` float32 XYXY, ``labels`` int64, ``iscrowd``, ``area`` (each box's, in the pixels as given),
        ``image_id`` (COCO's id, else -1), ``orig_size`` (the stored image's height and width); with masks, ``masks``
        uint8 ``n x h x w`` at the image's size.
        """
        cuts = self.counts.tolist()
        out = [
            {"boxes": b, "labels": lab, "iscrowd": c, "area": (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]),
             "image_id": i, "orig_size": size}
            for b, lab, c, i, size in zip(self.boxes.split(cuts), self.labels.split(cuts), self.iscrowd.split(cuts),
                                          self.image_ids, self.orig_sizes)
        ]  # fmt: skip
        if self.masks.ndim == 3 and self.masks.shape[1] > 0:
            for target, masks, (h, w) in zip(out, self.masks.split(cuts), self.sizes.tolist()):
                target["masks"] = masks[:, :h, :w]
        return out


def _masks_through(masks: np.ndarray, window: Window) -> torch.Tensor:
    """Each ``H x W`` mask through ``window`` (nearest sampling at pixel centres, as a segmentation mask), 0 around."""
    out = torch.zeros(len(masks), *window.size, dtype=torch.uint8)
    if not len(masks):
        return out
    top, left, box_h, box_w = window.box
    pt, pl, ph, pw = window.place
    rows = pixel_centres(top, box_h, ph)
    cols = pixel_centres(left, box_w, pw)
    if window.flip:
        cols = cols[::-1]
    out[:, pt : pt + ph, pl : pl + pw] = torch.from_numpy(np.take(np.take(masks, rows, axis=1), cols, axis=2))
    return out


class PaddedBoxes(NamedTuple):
    """A detection batch on the device in one tensor (``DetectionDataModule(batch_format="padded")``).

    ``images``: ``N x 3 x H x W`` normalised, each image at the top left, the rest 0; ``targets``: torchvision's
    target dicts; ``image_sizes``: ``N x 2`` int64, each image's height and width. ``images, targets = batch[:2]``.
    """

    images: torch.Tensor
    targets: list[dict[str, torch.Tensor]]
    image_sizes: torch.Tensor


class BoxTarget(TargetKind):
    """Boxes with their classes (module docstring).

    Args:
        categories: Each raw category (a COCO id, a VOC class name, a YOLO index) -> its label (``0 ..
            num_classes - 1``); one not in it is an error naming the file.
        num_classes: The labels' count (default: the mapping's largest label + 1).
        min_size: Boxes narrower or lower than this many pixels after a window are dropped (SanitizeBoundingBoxes').
        keep_crowds: Keep ``iscrowd`` boxes (evaluation); ``False`` leaves them out (torchvision's training targets).
        masks: Each box's instance mask too, from its COCO segmentation (polygons or RLE), through the same window
            (nearest sampling at pixel centres, as the masks of segmentation).
    """

    what: ClassVar[str] = "boxes"

    def __init__(
        self,
        categories: Mapping[Any, int],
        num_classes: int | None = None,
        min_size: float = 1.0,
        keep_crowds: bool = True,
        masks: bool = False,
    ) -> None:
        self.categories = dict(categories)
        self.masks = masks
        self.num_classes = num_classes if num_classes is not None else max(self.categories.values(), default=-1) + 1
        self.min_size, self.keep_crowds = float(min_size), keep_crowds
        #: Labels -> the loader's labels (``classes=``, a mix; ``-1``: dropped), or ``None``.
        self.class_map: np.ndarray | None = None

    def check_arrays(
        self,
        dtype: np.dtype,
        shape: tuple[int, ...],
        image_size: tuple[int, int] | None,
        path: str,
        keys: tuple[str, str],
    ) -> None:
        """An annotation per image: a 1-D dataset of variable-length bytes or strings (our JSON, VOC XML, YOLO text).

        Raises:
            ValueError: Otherwise (named).
        """
        if len(shape) != 1 or dtype.kind not in "OSU":
            raise InvalidValueError(
                f"{path}:{keys[1]} is {dtype} of shape {shape}: boxes are stored one annotation per image, a 1-D "
                "dataset of variable-length bytes (our JSON, as write_detection_hdf5 writes it)."
            )

    def decode(self, payload: Any, name: str) -> dict[str, Any]:
        """The annotation's boxes with labels (the data's classes), ``iscrowd`` and ``normalized``.

        Raises:
            DataError: For an unreadable annotation or a category not in ``categories`` (named).
        """
        raw = decode_annotation(payload, name)
        try:
            labels = np.asarray([self.categories[c] for c in raw["categories"]], np.int64)
        except KeyError as err:
            raise DataError(
                f"{name}: category {err.args[0]!r} is not one of the module's categories "
                f"({', '.join(map(repr, list(self.categories)[:8]))}{' ...' if len(self.categories) > 8 else ''})."
            ) from None
        said = raw.get("size")
        if said is not None and all(said) and not raw["normalized"] and len(raw["boxes"]):
            b = raw["boxes"]  # what the annotation says of its image: its boxes checked against it without a read
            bad = (b[:, 0] < -1) | (b[:, 1] < -1) | (b[:, 2] > said[0] + 1) | (b[:, 3] > said[1] + 1)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise DataError(f"{name}: box {k} {b[k].round(1).tolist()} lies outside its image ({said[0]}x"
                                f"{said[1]}, as the annotation says): fix the annotation.")  # fmt: skip
        keep = np.ones(len(labels), bool) if self.keep_crowds else raw["iscrowd"] == 0
        value = {"boxes": raw["boxes"][keep], "labels": labels[keep], "iscrowd": raw["iscrowd"][keep],
                 "normalized": raw["normalized"], "size": raw.get("size"),
                 "image_id": int(raw.get("image_id", -1))}  # fmt: skip
        if self.masks:
            segmentation = raw.get("segmentation")
            if segmentation is None or len(segmentation) != len(labels) or any(s is None for s in segmentation):
                raise DataError(
                    f"{name}: masks=True reads each box's segmentation (COCO's polygons or RLE), and this annotation "
                    "has none for some box: give COCO's annotations with segmentation, or masks=False."
                )
            value["segmentation"] = [seg for seg, k in zip(segmentation, keep.tolist()) if k]
        return value

    def relabel(self, value: dict[str, Any]) -> dict[str, Any]:
        """The boxes in the loader's classes; a box of a class left out is dropped."""
        if self.class_map is None:
            return value
        labels = self.class_map[value["labels"]]
        keep = labels >= 0
        out = {**value, "boxes": value["boxes"][keep], "labels": labels[keep], "iscrowd": value["iscrowd"][keep]}
        if "masks" in value:
            out["masks"] = value["masks"][keep]
        if "segmentation" in value:
            out["segmentation"] = [seg for seg, k in zip(value["segmentation"], keep.tolist()) if k]
        return out

    def mapped(self, class_map: np.ndarray | None) -> Self:
        """A copy relabelling class ``c`` to ``class_map[c]`` (``-1``: its boxes dropped)."""
        twin = copy.copy(self)
        twin.class_map = None if class_map is None else np.asarray(class_map, np.int64)
        return twin

    def sized(self, value: dict[str, Any], width: int, height: int, names: tuple[str, str]) -> dict[str, Any]:
        """Boxes in pixels of the ``width x height`` image (YOLO's fractions scaled), checked to lie in it.

        Raises:
            DataError: For a box outside the image by more than a pixel (an annotation of another image, or an
                EXIF-rotated photo: read as torchvision reads it, unrotated), or an image of another size than its
                annotation says, naming both files.
        """
        said = value.get("size")
        if said is not None and all(said) and tuple(said) != (width, height):
            turned = " (turned: an EXIF-rotated photo, which torchvision reads as stored, unrotated)"
            raise DataError(
                f"{names[1]}: the annotation says its image is {said[0]}x{said[1]}, {names[0]} is {width}x{height}"
                f"{turned if tuple(said) == (height, width) else ''}. Its boxes would land elsewhere: store the "
                "pixels as annotated (PIL.ImageOps.exif_transpose) or fix the annotation."
            )
        boxes = value["boxes"]
        if value["normalized"]:
            boxes = boxes * np.asarray([width, height, width, height], np.float32)
        bad = (boxes[:, 0] < -1) | (boxes[:, 1] < -1) | (boxes[:, 2] > width + 1) | (boxes[:, 3] > height + 1)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{names[1]}: box {k} {boxes[k].round(1).tolist()} lies outside its image {names[0]} ({width}x"
                f"{height}). The annotation is of another image or size (an EXIF-rotated photo is read unrotated, as "
                "torchvision reads it): fix the annotation."
            )
        out = {**value, "boxes": boxes, "normalized": False, "orig_size": value.get("orig_size", (height, width))}
        if self.masks and "masks" not in value:
            out["masks"] = _rasterized(value.get("segmentation") or [], height, width, names[1])
        return out

    def follow(self, value: dict[str, Any], window: Window) -> dict[str, torch.Tensor]:
        """The boxes through the window's linear map and mirror, clamped to its place, the degenerate dropped.

        An IoU crop's window (``window.centred``) also drops the boxes whose centre fell outside it.
        """
        top, left, bh, bw = window.box
        pt, pl, ph, pw = window.place
        b = value["boxes"].astype(np.float64)
        x = (b[:, [0, 2]] - left) * (pw / bw)
        y = (b[:, [1, 3]] - top) * (ph / bh)
        if window.flip:
            x = pw - x[:, ::-1]
        inside = np.ones(len(b), bool)
        if window.centred:  # an IoU crop keeps the boxes whose centre lies strictly inside it
            cx, cy = x.mean(axis=1), y.mean(axis=1)
            inside = (cx > 0) & (cx < pw) & (cy > 0) & (cy < ph)
        x = np.clip(x, 0, pw) + pl
        y = np.clip(y, 0, ph) + pt
        out = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1).astype(np.float32)
        keep = inside & ((out[:, 2] - out[:, 0]) >= self.min_size) & ((out[:, 3] - out[:, 1]) >= self.min_size)
        followed = {
            "boxes": torch.from_numpy(out[keep].copy()).reshape(-1, 4),
            "labels": torch.from_numpy(value["labels"][keep].copy()),
            "iscrowd": torch.from_numpy(value["iscrowd"][keep].copy()),
        }
        if "masks" in value:
            followed["masks"] = _masks_through(value["masks"][keep], window)
        followed["image_id"] = torch.tensor(int(value.get("image_id", -1)))
        followed["orig_size"] = torch.tensor(value.get("orig_size", (window.box[2], window.box[3])))
        return followed

    def collate(self, samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, BoxBatch]:
        """Images padded to the largest (0), their boxes packed (:class:`BoxBatch`)."""
        images, _ = padded_batch([(image, None) for image, _ in samples], 0)
        targets = [t for _, t in samples]
        masks = torch.zeros(0, 0, 0, dtype=torch.uint8)
        if targets and all("masks" in t for t in targets):  # each image's masks at the padded batch's top left
            masks = torch.zeros(sum(len(t["labels"]) for t in targets), *images.shape[2:], dtype=torch.uint8)
            start = 0
            for t in targets:
                n, h, w = t["masks"].shape
                masks[start : start + n, :h, :w] = t["masks"]
                start += n
        return images, BoxBatch(
            torch.cat([t["boxes"] for t in targets]).reshape(-1, 4),
            torch.cat([t["labels"] for t in targets]),
            torch.cat([t["iscrowd"] for t in targets]),
            torch.tensor([len(t["labels"]) for t in targets], dtype=torch.int64),
            torch.tensor([tuple(image.shape[1:]) for image, _ in samples], dtype=torch.int64).reshape(-1, 2),
            masks,
            torch.stack([t["image_id"] for t in targets]).to(torch.int64).reshape(-1),
            torch.stack([t["orig_size"] for t in targets]).to(torch.int64).reshape(-1, 2),
        )

    def present(self, value: dict[str, Any]) -> np.ndarray:
        """Which classes the image's boxes hold (``num_classes`` 0/1)."""
        row = np.zeros(self.num_classes, np.uint8)
        row[value["labels"]] = 1
        return row

    def cache_key(self) -> bytes:
        """The category map and whether masks are kept: a cache of boxes (every box, crowds too) depends on them."""
        return json.dumps([sorted((str(k), v) for k, v in self.categories.items()), self.masks, "v2"]).encode()

    def evaluating(self) -> Self:
        """A copy keeping the crowds (what evaluation and a cache read)."""
        twin = copy.copy(self)
        twin.keep_crowds = True
        return twin

    def stored(self, value: dict[str, torch.Tensor]) -> np.ndarray:
        """A header, each box as a 21-byte row, then, with masks, each mask's pixels.

        The header: the image's id, its original height and width, the box count (int64, 3 x int32); a row: the
        box's edges (float32), its label (int32) and crowd flag.
        """
        rows = np.zeros(len(value["labels"]), _STORED)
        rows["box"], rows["label"], rows["crowd"] = value["boxes"].numpy(), value["labels"].numpy(), value["iscrowd"]
        head = np.zeros(1, _HEADER)
        head["image_id"], head["orig"], head["count"] = int(value["image_id"]), value["orig_size"].numpy(), len(rows)
        parts = [head.view(np.uint8).ravel(), rows.view(np.uint8).ravel()]
        if self.masks:
            parts.append(value["masks"].numpy().ravel())
        return np.concatenate(parts)

    def restored(self, data: np.ndarray, height: int, width: int) -> dict[str, Any]:
        """The stored boxes (and masks) in the cached image's pixels, in the data's classes.

        Crowds left out unless kept.
        """
        data = np.ascontiguousarray(data)
        head = data[: _HEADER.itemsize].view(_HEADER)[0]
        n, end = int(head["count"]), _HEADER.itemsize + int(head["count"]) * _STORED.itemsize
        rows = data[_HEADER.itemsize : end].view(_STORED)
        keep = np.ones(len(rows), bool) if self.keep_crowds else rows["crowd"] == 0
        value = {"boxes": rows["box"][keep].copy(), "labels": rows["label"][keep].astype(np.int64),
                 "iscrowd": rows["crowd"][keep].copy(), "normalized": False, "image_id": int(head["image_id"]),
                 "orig_size": tuple(int(v) for v in head["orig"])}  # fmt: skip
        if self.masks:
            value["masks"] = data[end:].reshape(n, height, width)[keep]
        return value

    def on_device(self, targets: BoxBatch) -> list[dict[str, torch.Tensor]]:
        """The list of target dicts torchvision takes."""
        return targets.targets()
