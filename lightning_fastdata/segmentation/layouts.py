"""Where a segmentation split's images and masks are, and what a mask's values mean, for the layouts users have.

- ``"voc"``: ``JPEGImages/<id>.jpg`` and ``SegmentationClass/<id>.png`` (palette PNGs whose indices are the classes,
  255 on object borders), the split's ids listed in ``ImageSets/Segmentation/<split>.txt``.
- ``"ade20k"``: ``images/<split>/**/<stem>.jpg`` and ``annotations/<split>/**/<stem>.png`` (ADE20K's scene parsing:
  ``training``, ``validation``); its masks' 0 is "other" (ignored) and ``k`` is class ``k - 1``.
- ``"cityscapes"``: ``leftImg8bit/<split>/<city>/<name>_leftImg8bit.png`` and
  ``gtFine/<split>/<city>/<name>_gtFine_labelIds.png``; label ids become Cityscapes' 19 training ids by its label
  table (:data:`CITYSCAPES_TRAIN_IDS`), every other id ignored.
- ``"paired"``: ``<images_dir>/<split>/**/<stem>.<ext>`` and ``<masks_dir>/<split>/**/<stem>.png``, matched by relative
  path and stem at any depth (``split=""``: the two folders themselves); mask values are the classes.

``"auto"`` tells them apart by the root's folders. Every layout reads through the package's storage, so a root is a
local folder or a bucket URL (``s3://...``) alike. What a mask value means is one table (:func:`mask_table`: 256
entries, ``-1`` for a value that is no class): the layout's, or the user's ``label_map``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.sources.folder import FolderPairs

__all__ = [
    "CITYSCAPES_CLASSES",
    "CITYSCAPES_TRAIN_IDS",
    "CONVERTED_MASKS",
    "LAYOUTS",
    "LAYOUT_CLASSES",
    "NAMED_TABLES",
    "classes_of_layout",
    "Layout",
    "MaskLayout",
    "find_pairs",
    "join_url",
    "map_mask",
    "mask_table",
    "named_table_classes",
    "refuse_named_table_on_classes",
    "voc_palette",
]

Layout = Literal["auto", "voc", "ade20k", "cityscapes", "paired", "shards", "parquet"]
#: The layouts a segmentation source takes (``layout=``).
LAYOUTS = ("auto", "voc", "ade20k", "cityscapes", "paired", "shards", "parquet")

#: Cityscapes' 19 training classes, in training-id order.
CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign", "vegetation", "terrain",
    "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle",
)  # fmt: skip
#: Cityscapes' label id -> training id (its ``labels.py``); the ids not listed (0-6, 9, 10, 14-16, 18, 29, 30) are
#: ignored.
CITYSCAPES_TRAIN_IDS = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12, 26: 13, 27: 14,
    28: 15, 31: 16, 32: 17, 33: 18,
}  # fmt: skip
_CITYSCAPES_IGNORED = (0, 1, 2, 3, 4, 5, 6, 9, 10, 14, 15, 16, 18, 29, 30)
#: ADE20K's scene parsing: 150 classes.
ADE20K_CLASSES = 150
#: The tables ``label_map=`` may name, and their classes.
NAMED_TABLES = {"ade20k": ADE20K_CLASSES, "cityscapes": len(CITYSCAPES_CLASSES)}
#: The classes of the layouts that fix them (VOC's 21, background and 20 objects; ADE20K's 150; Cityscapes' 19).
LAYOUT_CLASSES = {"voc": 21, **NAMED_TABLES}


def join_url(root: str, *parts: str) -> str:
    """``root`` and ``parts`` joined by ``/`` (a local path or a URL alike), empty parts left out."""
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])


def _folders(root: str, storage_options: Mapping[str, Any] | None) -> set[str]:
    try:
        return set(open_storage(root, storage_options).list_classes())
    except FileNotFoundError:
        return set()


def detect_layout(root: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """The layout of ``root`` by its top folders (module docstring).

    Raises:
        FileNotFoundError: If none fits (the folders found named).
    """
    top = _folders(root, storage_options)
    if {"JPEGImages", "SegmentationClass"} <= top:
        return "voc"
    if {"leftImg8bit", "gtFine"} <= top:
        return "cityscapes"
    if {"images", "annotations"} <= top:
        storage = open_storage(root, storage_options)
        try:
            storage.stat("objectInfo150.txt")
            return "ade20k"
        except FileNotFoundError:
            return "paired"
    raise PathNotFoundError(
        f"{root} is not a segmentation layout this package knows (its folders: {sorted(top) or 'none'}): VOC "
        "(JPEGImages, SegmentationClass, ImageSets/Segmentation), ADE20K or paired folders (images, annotations), "
        "Cityscapes (leftImg8bit, gtFine). Give layout= and, for paired folders, images_dir= and masks_dir=."
    )


def _listed(root: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    try:
        index = open_storage(root, storage_options).list_images()
    except FileNotFoundError as err:
        raise PathNotFoundError(f"{root} holds no image ({err}).") from None
    return [index.relpath(i) for i in range(len(index))]


def _voc(root: str, split: str, options: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    listing = f"ImageSets/Segmentation/{split}.txt"
    data = next(iter(open_storage(root, options).read_many([listing])))
    if isinstance(data, OSError):
        raise PathNotFoundError(f"{join_url(root, listing)} does not exist: a VOC folder lists each split's ids there.")
    ids = [line.strip() for line in data.decode("utf-8").splitlines() if line.strip()]
    if not ids:
        raise InvalidValueError(f"{join_url(root, listing)} lists no id.")
    images = set(_listed(join_url(root, "JPEGImages"), options))
    masks = set(_listed(join_url(root, "SegmentationClass"), options))
    for i in ids:
        for kind, rel, have in (("image", f"{i}.jpg", images), ("mask", f"{i}.png", masks)):
            if rel not in have:
                folder = "JPEGImages" if kind == "image" else "SegmentationClass"
                raise PathNotFoundError(
                    f"{join_url(root, listing)} names {i!r}, whose {kind} {join_url(root, folder, rel)} does not exist."
                )
    return [f"JPEGImages/{i}.jpg" for i in ids], [f"SegmentationClass/{i}.png" for i in ids]


def _stem(rel: str) -> str:
    dot = rel.rfind(".")
    return rel[:dot] if dot > rel.rfind("/") else rel


def _paired(
    root: str, images_dir: str, masks_dir: str, split: str, options: Mapping[str, Any] | None, cityscapes: bool
) -> tuple[list[str], list[str]]:
    image_root, mask_root = join_url(images_dir, split), join_url(masks_dir, split)
    masks: dict[str, str] = {}
    for rel in _listed(join_url(root, mask_root), options):
        if cityscapes and not rel.endswith("_gtFine_labelIds.png"):
            continue  # Cityscapes keeps colour, instance and polygon files beside the label ids
        if not cityscapes and not rel.lower().endswith(".png"):
            continue
        masks[_stem(rel).removesuffix("_gtFine_labelIds") if cityscapes else _stem(rel)] = rel
    images, paired = [], []
    for rel in _listed(join_url(root, image_root), options):
        key = _stem(rel).removesuffix("_leftImg8bit") if cityscapes else _stem(rel)
        if key not in masks:
            want = f"{key}_gtFine_labelIds.png" if cityscapes else f"{key}.png"
            raise DataError(
                f"The image {join_url(root, image_root, rel)} has no mask: expected {join_url(root, mask_root, want)} "
                "(masks are matched by relative path and stem). Add the mask or remove the image."
            )
        images.append(f"{image_root}/{rel}")
        paired.append(f"{mask_root}/{masks[key]}")
    return images, paired


def find_pairs(
    root: str,
    split: str,
    layout: str = "auto",
    images_dir: str = "images",
    masks_dir: str = "annotations",
    storage_options: Mapping[str, Any] | None = None,
) -> FolderPairs:
    """The images and masks of ``split`` under ``root`` (module docstring).

    Raises:
        FileNotFoundError: If the split, an image's mask, or a listed image or mask is missing (named).
        ValueError: If ``layout`` is not one of :data:`LAYOUTS`.
    """
    if layout not in LAYOUTS:
        raise InvalidValueError(f"layout should be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}.")
    found = detect_layout(root, storage_options) if layout == "auto" else layout
    if found == "voc":
        images, masks = _voc(root, split, storage_options)
    elif found == "cityscapes":
        images, masks = _paired(root, "leftImg8bit", "gtFine", split, storage_options, cityscapes=True)
    else:
        images, masks = _paired(root, images_dir, masks_dir, split, storage_options, cityscapes=False)
    return FolderPairs(found, tuple(images), tuple(masks))


@dataclass(frozen=True)
class MaskLayout:
    """A folder layout of images and masks (:data:`~lightning_fastdata.sources.folder.FolderLayout`): find_pairs'.

    Attributes:
        layout: ``"auto"``, ``"voc"``, ``"ade20k"``, ``"cityscapes"`` or ``"paired"``.
        images_dir: Paired folders: the images' folder under the root.
        masks_dir: Paired folders: the masks' folder under the root.
    """

    layout: str = "auto"
    images_dir: str = "images"
    masks_dir: str = "annotations"

    def __call__(self, root: str, split: str, storage_options: Mapping[str, Any] | None) -> FolderPairs:
        """The split's pairs (:func:`find_pairs`)."""
        return find_pairs(root, split, self.layout, self.images_dir, self.masks_dir, storage_options)


def mask_table(
    layout: str, num_classes: int, ignore_index: int, label_map: Mapping[int, int] | str | None
) -> np.ndarray:
    """What each mask value (0-255) means: its class, ``ignore_index``, or ``-1`` (no class: an error if met).

    ``label_map`` (mask value -> class, or -> ``ignore_index``) replaces the layout's own table: Cityscapes' label
    ids -> training ids, ADE20K's ``k -> k - 1`` with 0 ignored, the values themselves for VOC and paired folders.
    ``label_map="ade20k"`` or ``"cityscapes"`` names one of those tables, for masks coded so in another layout (the
    hubs' ADE20K Parquet files keep its values).

    Raises:
        ValueError: If the table maps a value to a class at or above ``num_classes`` (other than the ignore index),
            a layout's own table has fewer classes than ``num_classes`` (Cityscapes with the default 21), or
            ``label_map`` names no table.
    """
    table = np.full(256, -1, dtype=np.int16)
    table[ignore_index] = ignore_index
    if isinstance(label_map, str):
        named_table_classes(label_map)
        layout, label_map = label_map, None
    fixed = None  # the classes a layout's own table gives
    if label_map is not None:
        pairs = {int(k): int(v) for k, v in label_map.items()}
        what = "label_map"
    elif layout == "cityscapes":
        pairs = {**dict.fromkeys(_CITYSCAPES_IGNORED, ignore_index), **CITYSCAPES_TRAIN_IDS}
        what, fixed = "Cityscapes' label table (19 classes)", len(CITYSCAPES_CLASSES)
    elif layout == "ade20k":
        pairs = {0: ignore_index, **{k: k - 1 for k in range(1, ADE20K_CLASSES + 1)}}
        what, fixed = "ADE20K's labels (150 classes)", ADE20K_CLASSES
    else:
        pairs = {k: k for k in range(num_classes)}
        what = ""
    if fixed is not None and num_classes > fixed:  # the classes above the table's would be trained, never seen
        raise InvalidValueError(
            f"{what} gives {fixed} classes and num_classes is {num_classes}: classes {fixed} .. {num_classes - 1} "
            f"would be trained and scored though no pixel holds them. Give num_classes={fixed}."
        )
    for value, cls in pairs.items():
        if not 0 <= value <= 255 or not (0 <= cls < num_classes or cls == ignore_index):
            raise InvalidValueError(
                f"{what} maps the mask value {value} to {cls}: values are 0-255 and classes 0 .. {num_classes - 1} "
                f"(num_classes={num_classes}) or the ignore index {ignore_index}; give num_classes= the classes used."
            )
        table[value] = cls
    return table


def classes_of_layout(
    found: str, label_map: Mapping[int, int] | str | None, ignore_index: int, what: str, flag: str = ""
) -> int:
    """The classes masks hold, told by ``label_map`` or the ``found`` layout.

    ``what`` names the data in the error, ``flag`` the command-line option beside ``num_classes=``.

    A named table's classes; a mapping's largest class + 1; VOC's 21, ADE20K's 150, Cityscapes' 19.

    Raises:
        ValueError: If neither tells them (paired folders, shards, Parquet, HDF5 without a ``label_map``).
    """
    why = "label_map maps every value to the ignore index"
    if isinstance(label_map, str):
        classes = named_table_classes(label_map)
    elif label_map is not None:
        classes = max((int(v) for v in label_map.values() if int(v) != ignore_index), default=-1) + 1
    else:
        classes, why = LAYOUT_CLASSES.get(found, 0), f"the {found} layout does not fix them"
    if not classes:
        raise InvalidValueError(
            f"{what}: give num_classes={flag} the classes its masks hold ({why}), so that a value that is no class is "
            "found now, not in training."
        )
    return classes


def named_table_classes(name: str) -> int:
    """The classes of the table ``label_map=name`` names (:data:`NAMED_TABLES`).

    Raises:
        ValueError: If ``name`` names no table.
    """
    if name not in NAMED_TABLES:
        raise InvalidValueError(
            f"label_map={name!r}: give a mapping of mask value -> class, or the name of a table "
            f"({', '.join(map(repr, NAMED_TABLES))})."
        )
    return NAMED_TABLES[name]


#: What ``fastdata convert segmentation`` records in the files it writes (Parquet schema metadata under this key, the
#: HDF5 masks dataset's attribute of this name): their masks hold classes, the layout's table already applied.
CONVERTED_MASKS = "lightning_fastdata_masks"


def refuse_named_table_on_classes(label_map: Mapping[int, int] | str | None, marker: Any, where: str) -> None:
    """Refuse a named table (``label_map="ade20k"``) on masks that our converter wrote as classes (``marker``).

    Raises:
        ValueError: If ``label_map`` names a table and ``marker`` says ``"classes"`` (``where``: the file).
    """
    if isinstance(label_map, str) and marker in ("classes", b"classes"):
        raise InvalidValueError(
            f"{where} was written by `fastdata convert segmentation`: its masks already hold classes (the layout's "
            f"table was applied when it was written). label_map={label_map!r} would apply a table again and shift "
            "every class; leave label_map out."
        )


def map_mask(mask: np.ndarray, table: np.ndarray, name: str, num_classes: int, ignore_index: int) -> np.ndarray:
    """``mask``'s values as classes through ``table`` (``uint8``).

    Raises:
        DataError: If a value means no class (named with the file).
    """
    identity = bool((table[:num_classes] == np.arange(num_classes)).all()) and (table[num_classes:] < 0).sum() == (
        255 - num_classes
    )
    if identity:  # the values are the classes: only a check
        bad = (mask >= num_classes) & (mask != ignore_index)
        if bad.any():
            _unknown(name, int(mask[bad].max()), num_classes, ignore_index)
        return mask
    mapped = table[mask]
    if (mapped < 0).any():
        _unknown(name, int(mask[mapped < 0].max()), num_classes, ignore_index)
    return mapped.astype(np.uint8)


def _unknown(name: str, value: int, num_classes: int, ignore_index: int) -> None:
    raise DataError(
        f"{name} holds the value {value}, which is no class of the {num_classes} (num_classes=) and not the ignore "
        f"index {ignore_index}: give num_classes= the classes the masks use, or label_map= what each value means."
    )


def voc_palette() -> list[int]:
    """VOC's colour map (index -> RGB, 768 values): what a palette PNG viewer shows each class as."""
    out = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out += [r, g, b]
    out[3 * 255 : 3 * 256] = [224, 224, 192]
    return out
