"""``MaskTarget``: a per-pixel class mask, the target kind of semantic segmentation.

A mask's payload is a palette or grey PNG (a file, a tar member, a Parquet cell) or an integer array (an HDF5 row);
its values become classes through the layout's table (:func:`~lightning_fastdata.segmentation.layouts.mask_table`:
VOC's values as they are, ADE20K's shifted, Cityscapes' label ids to training ids, or ``label_map=``). It follows its
image's :class:`~lightning_fastdata.sources.window.Window` by nearest sampling from the same pixel centres
(:func:`~lightning_fastdata.sources.window.render_mask`), padding with the ignore index; a batch of masks is uint8
``N x H x W`` in shared memory with its images, made ``int64`` on the device.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.segmentation.layouts import (
    CONVERTED_MASKS,
    map_mask,
    mask_table,
    refuse_named_table_on_classes,
)
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.window import Window, render_mask
from lightning_fastdata.sources.windowed import padded_batch

__all__ = ["IGNORE_INDEX", "MaskTarget", "read_mask"]

#: The mask value of padding and of pixels no class covers (VOC's object borders), ignored by the loss.
IGNORE_INDEX = 255


def read_mask(data: bytes, name: str) -> np.ndarray:
    """A mask file's values (``H x W`` uint8): a palette or grey PNG's values as they are.

    Raises:
        DataError: For an RGB mask (its colours are not classes: give a palette PNG) or an unreadable file (named).
    """
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode not in ("P", "L"):
                raise DataError(
                    f"{name} is a {im.mode} mask: its pixels are colours, not classes. Give palette (P) or grey (L) "
                    "PNGs whose values are the class indices (VOC's SegmentationClass), or convert it with a colour "
                    "table first."
                )
            return np.asarray(im, dtype=np.uint8).copy()
    except OSError as err:
        raise DataError(f"{name} is not a readable mask ({err}).") from None


class MaskTarget(TargetKind):
    """A class per pixel (module docstring).

    Args:
        num_classes: The classes a mask holds (``0 .. num_classes - 1``, and ``ignore_index``).
        ignore_index: The mask value of borders and padding (at most 255, above every class).
        label_map: Mask value -> class (or -> ``ignore_index``), replacing the layout's own meaning of the values; a
            value it does not name is an error. ``"ade20k"``/``"cityscapes"``: that layout's table.

    Raises:
        ValueError: On classes that do not fit uint8 masks below the ignore index, or a bad ``label_map`` (named).
    """

    what: ClassVar[str] = "mask"

    def __init__(
        self, num_classes: int = 21, ignore_index: int = IGNORE_INDEX, label_map: Mapping[int, int] | str | None = None
    ) -> None:
        if not 0 < num_classes <= 255 or not 0 <= ignore_index <= 255 or ignore_index < num_classes:
            raise InvalidValueError(
                f"num_classes={num_classes!r} and ignore_index={ignore_index!r}: masks are uint8, so classes are "
                "0 .. num_classes - 1 below the ignore index (at most 255)."
            )
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.label_map = label_map if isinstance(label_map, str) or label_map is None else dict(label_map)
        #: Mask value -> class (``mask_table``): the layout's own, or ``label_map``'s.
        self.table = mask_table("", num_classes, ignore_index, label_map)
        #: Classes -> the loader's classes (``classes=``, a mix; the others ignored), applied after :attr:`table`.
        self.renumber: np.ndarray | None = None
        #: Whether the first masks are checked for 0/255 binary coding (paired folders without a ``label_map``).
        self.refuse_binary = False

    def bound(self, layout: str, attrs: Mapping[str, Any], where: str) -> Self:
        """The layout's table (unless ``label_map``); a named table on masks our converter wrote as classes refused.

        Raises:
            ValueError: If ``label_map`` names a table and the file says its masks hold classes already.
        """
        refuse_named_table_on_classes(self.label_map, attrs.get(CONVERTED_MASKS), where)
        twin = copy.copy(self)
        twin.table = mask_table(layout, self.num_classes, self.ignore_index, self.label_map)
        twin.refuse_binary = layout == "paired" and self.label_map is None and self.ignore_index == 255
        return twin

    @property
    def first_checked(self) -> int:  # type: ignore[override]
        """The first 8 masks of paired folders without a ``label_map`` (0/255 binary masks refused)."""
        return 8 if self.refuse_binary else 0

    def check_first(self, payloads: Sequence[Any], where: str) -> None:
        """Refuse paired masks that look coded 0/255 (the common binary convention) unless a ``label_map`` says so.

        255 is the ignore index: such masks would lose every foreground pixel from the loss and metrics, silently.

        Raises:
            ValueError: If the masks hold no value but 0 and 255, and some 255.
        """
        values: set[int] = set()
        for payload in payloads:
            values.update(np.unique(read_mask(payload, where)).tolist())
        if values <= {0, 255} and 255 in values:
            raise InvalidValueError(
                f"The masks of {where} hold only 0 and 255: binary masks coded 0/255? 255 is the ignore index, so "
                "every foreground pixel would be left out of the loss and the metrics. For binary masks give "
                "label_map={0: 0, 255: 1} (and num_classes=2); if 255 means 'ignore' here, say so with "
                "label_map={0: 0, 255: 255}."
            )

    def check_arrays(
        self,
        dtype: np.dtype,
        shape: tuple[int, ...],
        image_size: tuple[int, int] | None,
        path: str,
        keys: tuple[str, str],
    ) -> None:
        """Integer ``N x H x W`` (or ``N x H x W x 1``) masks, each its image's size where the images are decoded.

        Raises:
            ValueError: Otherwise (named).
        """
        if dtype.kind not in "iu" or not (len(shape) == 3 or len(shape) == 4 and shape[3] == 1):
            raise InvalidValueError(
                f"{path}:{keys[1]} is {dtype} of shape {shape}: masks are integer N x H x W (or N x H x W x 1) "
                "arrays of class indices."
            )
        if image_size is not None and tuple(image_size) != tuple(shape[1:3]):
            raise InvalidValueError(
                f"{path}: the images ({keys[0]}) are {image_size[1]}x{image_size[0]}, the masks ({keys[1]}) "
                f"{shape[2]}x{shape[1]}: a mask must be its image's size."
            )

    def decode(self, payload: Any, name: str) -> np.ndarray:
        """A PNG's or a stored array's values as the data's classes (``H x W`` uint8).

        Raises:
            DataError: For an unreadable or RGB mask, or a value that is no class (named).
        """
        values = (
            read_mask(bytes(payload), name) if isinstance(payload, (bytes, bytearray)) else self._stored(payload, name)
        )
        return map_mask(values, self.table, name, self.num_classes, self.ignore_index)

    def _stored(self, value: np.ndarray, name: str) -> np.ndarray:
        """A stored mask's values as uint8 (``H x W``), checked to be 0-255."""
        values = value[..., 0] if value.ndim == 3 else value
        if values.dtype != np.uint8:
            low, high = int(values.min()), int(values.max())
            if low < 0 or high > 255:
                raise DataError(
                    f"{name} holds the value {low if low < 0 else high}, which is no class of the "
                    f"{self.num_classes} (num_classes=) and not the ignore index {self.ignore_index}."
                )
            values = values.astype(np.uint8)
        return values

    def relabel(self, value: np.ndarray) -> np.ndarray:
        """The mask in the loader's classes (:attr:`renumber`)."""
        return value if self.renumber is None else self.renumber[value]

    def mapped(self, class_map: np.ndarray | None) -> Self:
        """A copy renumbering class ``c`` to ``class_map[c]``, every class mapped to ``-1`` to the ignore index."""
        twin = copy.copy(self)
        twin.renumber = None
        if class_map is not None:
            twin.renumber = np.full(256, self.ignore_index, dtype=np.uint8)
            taken = np.flatnonzero(np.asarray(class_map) >= 0)
            twin.renumber[taken] = np.asarray(class_map)[taken].astype(np.uint8)
        return twin

    def size_of(self, value: np.ndarray) -> tuple[int, int]:
        """The mask's ``(width, height)``: its image's."""
        return int(value.shape[1]), int(value.shape[0])

    def check_size(self, value: np.ndarray, width: int, height: int, names: tuple[str, str]) -> None:
        """A mask must be its image's size.

        Raises:
            DataError: Otherwise (both named).
        """
        if (int(value.shape[1]), int(value.shape[0])) != (width, height):
            raise DataError(
                f"{names[1]} is {value.shape[1]}x{value.shape[0]}, its image {names[0]} is {width}x{height}: a mask "
                "must be its image's size."
            )

    def follow(self, value: np.ndarray, window: Window) -> torch.Tensor:
        """Nearest sampling into the window's place, the padding :attr:`ignore_index`."""
        return render_mask(value, window, fill=self.ignore_index)

    def collate(self, samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images and masks padded to the largest (images 0, masks the ignore index), in shared memory together."""
        images, masks = padded_batch(samples, self.ignore_index)
        assert masks is not None
        return images, masks

    def present(self, value: np.ndarray) -> np.ndarray:
        """Which classes the mask holds (``num_classes`` 0/1)."""
        return (np.bincount(value.ravel(), minlength=256)[: self.num_classes] > 0).astype(np.uint8)

    def cache_key(self) -> bytes:
        """The table: a cache holds the data's classes."""
        return self.table.tobytes()

    def stored(self, value: torch.Tensor) -> np.ndarray:
        """The mask's classes, row by row."""
        return value.numpy().astype(np.uint8, copy=False).ravel()

    def restored(self, data: np.ndarray, height: int, width: int) -> np.ndarray:
        """The mask as it was stored (the data's classes)."""
        return data.reshape(height, width)

    def on_device(self, targets: torch.Tensor) -> torch.Tensor:
        """``int64`` masks, as ``cross_entropy`` takes them."""
        return targets.long()
