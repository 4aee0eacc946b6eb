"""The target contract: what rides with an image through a windowed source, and all a source asks of it.

A sample of a windowed source (:class:`~lightning_fastdata.sources.windowed.WindowedDataset`) is an image and a
*payload*: the encoded bytes (a PNG mask, an annotation file, a caption) or the stored array (an HDF5 row) of what
rides with it. The source reads both and never looks inside the payload; a :class:`TargetKind` turns the payload into
a value (:meth:`~TargetKind.decode`), moves it with the image's window exactly (:meth:`~TargetKind.follow`), batches
it with the images (:meth:`~TargetKind.collate`), says what sampling counts (:meth:`~TargetKind.present`), what a
cache of it depends on (:meth:`~TargetKind.cache_key`) and how the cache keeps it (:meth:`~TargetKind.stored`). A new
target (boxes) is one class of this contract in its own room; a new source (a format) is one subclass of
``WindowedDataset``: neither touches the other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import numpy as np
import torch

from lightning_fastdata.sources.window import Window

__all__ = ["TargetKind"]


class TargetKind(ABC):
    """What rides with an image in a windowed source (module docstring); immutable: changes return copies.

    Attributes:
        what: The payload's name in messages (``"mask"``, ``"boxes"``).
        num_classes: The classes a value holds (what :meth:`present` counts).
    """

    what: ClassVar[str]
    num_classes: int

    def bound(self, layout: str, attrs: Mapping[str, Any], where: str) -> Self:
        """This target as it reads one source: ``layout`` (a folder's, ``""`` elsewhere), the field's ``attrs``.

        ``attrs``: what the file says of the payload field (an HDF5 dataset's attributes, a Parquet file's metadata),
        ``where`` names it in errors. By default the target itself.
        """
        return self

    #: How many of a folder's first payloads :meth:`check_first` looks at (0: none are read for it).
    first_checked: int = 0

    def check_first(self, payloads: Sequence[Any], where: str) -> None:  # noqa: B027 - by default nothing to check
        """Refuse a source whose first payloads show a convention this target would read wrongly (by default none)."""

    def check_arrays(  # noqa: B027 - by default nothing to check
        self,
        dtype: np.dtype,
        shape: tuple[int, ...],
        image_size: tuple[int, int] | None,
        path: str,
        keys: tuple[str, str],
    ) -> None:
        """Refuse a stored array field (an HDF5 dataset) that cannot hold this target (by default none).

        ``image_size``: the images' ``(height, width)`` where they are stored decoded, else ``None``; ``path`` and
        ``keys`` (the images' dataset, the target's) name them.
        """

    @abstractmethod
    def decode(self, payload: Any, name: str) -> Any:
        """A payload (encoded bytes, or a stored array) as this target's value, in the data's classes.

        Raises:
            DataError: If it is not such a payload, or holds a value that is no class (``name`` names it).
        """

    def relabel(self, value: Any) -> Any:
        """A decoded value in the loader's classes (``classes=``, a mix's class list): by default as it is."""
        return value

    def size_of(self, value: Any) -> tuple[int, int] | None:
        """The image size ``(width, height)`` the value fixes (a mask's), or ``None`` (read the image's header)."""
        return None

    def check_size(self, value: Any, width: int, height: int, names: tuple[str, str]) -> None:  # noqa: B027
        """Refuse a value that cannot belong to a ``width x height`` image (``names``: the image's, the payload's)."""

    def sized(self, value: Any, width: int, height: int, names: tuple[str, str]) -> Any:
        """The value in the pixels of its ``width x height`` image (YOLO's 0-1 boxes scaled), checked; by default as is.

        Raises:
            DataError: If it cannot belong to such an image (a box outside it; ``names``: image, payload).
        """
        return value

    @abstractmethod
    def follow(self, value: Any, window: Window) -> Any:
        """The value where the image's ``window`` puts its pixels: the same crop, resize, flip and padding."""

    @abstractmethod
    def collate(self, samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, Any]:
        """Rendered ``(image, followed value)`` samples as a batch: the images padded to the largest, the targets."""

    @abstractmethod
    def present(self, value: Any) -> np.ndarray:
        """The classes a decoded value holds: a ``num_classes`` row of 0/1 (what sampling by class draws by)."""

    @abstractmethod
    def mapped(self, class_map: np.ndarray | None) -> Self:
        """A copy whose values are relabelled data class ``c`` -> ``class_map[c]`` (``-1``: no class any more).

        ``None``: the data's classes. Replaces any earlier map (``classes=``, a mix's class list).
        """

    def kept(self, positions: Sequence[int] | None) -> Self:
        """A copy keeping ``positions``' classes, renumbered ``positions[k] -> k`` (``None``: the data's classes)."""
        if positions is None:
            return self.mapped(None)
        class_map = np.full(self.num_classes, -1, dtype=np.int64)
        class_map[np.asarray(positions, dtype=np.int64)] = np.arange(len(positions))
        return self.mapped(class_map)

    @abstractmethod
    def cache_key(self) -> bytes:
        """What a decoded value depends on besides the source (a cache of values is named after it)."""

    def stored(self, value: Any) -> np.ndarray:
        """A followed value as the decoded cache keeps it: 1-D uint8 (:mod:`~lightning_fastdata.sources.cache`).

        Raises:
            NotImplementedError: For a target kind no cache holds (by default).
        """
        raise NotImplementedError(f"{type(self).__name__}'s values cannot be cached.")

    def restored(self, data: np.ndarray, height: int, width: int) -> Any:
        """A value the cache kept (:meth:`stored`) for its ``height x width`` image, as :meth:`decode` gives one.

        Raises:
            NotImplementedError: For a target kind no cache holds (by default).
        """
        raise NotImplementedError(f"{type(self).__name__}'s values cannot be cached.")

    def evaluating(self) -> Self:
        """This target as evaluation (and a cache) reads it: by default itself (boxes: their crowds kept)."""
        return self

    def on_device(self, targets: Any) -> Any:
        """A batch's targets as a model takes them, once on the device (by default as they are)."""
        return targets
