"""``CaptionTarget``: an image's caption(s), the target kind of image-text pairs.

A sample's payload is its text member of a WebDataset shard (img2dataset's ``key.txt``, or a field of ``key.json``:
``caption``, or a list of captions such as COCO Captions' five), or a Parquet text column's value. A caption does not
move with the image's window (:meth:`CaptionTarget.follow` leaves it as it is); which of an image's captions a sample
takes is drawn from its key by the recipe (:class:`~lightning_fastdata.captions.recipe.CaptionRecipe`), which also
runs ``text_transform`` (a tokenizer) in the loader workers. A batch is the images and their texts: a list of strings,
or the tokenizer's outputs collated (tensors stacked, dicts of tensors stacked per key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import numpy as np
import torch

from lightning_fastdata.errors import DataError
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.window import Window
from lightning_fastdata.sources.windowed import padded_batch

__all__ = ["CaptionTarget", "collate_texts", "read_captions"]


def read_captions(payload: Any, name: str, field: str = "caption") -> list[str]:
    """An image's captions from its payload: text (``.txt``), JSON (``field``: a string or a list), or a value.

    Raises:
        DataError: For a payload with no caption (an empty text, a JSON without ``field``), named.
    """
    if isinstance(payload, str):
        captions: Any = payload
    elif isinstance(payload, (list, tuple)):
        captions = list(payload)
    else:
        data = bytes(payload)
        text = data.decode("utf-8", errors="replace")
        captions = text
        if data.lstrip()[:1] == b"{":
            try:
                captions = json.loads(text).get(field)
            except (ValueError, AttributeError) as err:
                raise DataError(f"{name} is not readable JSON ({err}).") from None
            if captions is None:
                raise DataError(f"{name} has no {field!r} field: give caption_field= the field of its caption.")
    out = [captions] if isinstance(captions, str) else [str(c) for c in captions]
    out = [c.strip() for c in out if str(c).strip()]
    if not out:
        raise DataError(f"{name} holds no caption.")
    return out


def _stacked(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """One caption's tensors as a batch: stacked, or joined where each is a batch of one already.

    open_clip's tokenizers (and the hubs' with ``return_tensors="pt"``) give a string a ``1 x L`` batch: the batch is
    ``N x L``, as open_clip's own loader makes it (``tokenizer(text)[0]``), not ``N x 1 x L``.
    """
    first = values[0]
    if first.dim() >= 2 and first.shape[0] == 1 and all(v.shape == first.shape for v in values):
        return torch.cat(list(values))
    return torch.stack([v.reshape(first.shape) for v in values])


def collate_texts(texts: Sequence[Any]) -> Any:
    """A batch's texts: strings as a list; tensors stacked; dicts of tensors stacked per key; else a list.

    A tokenizer's batch of one per caption (``1 x L``) is joined into ``N x L``.
    """
    first = texts[0] if texts else None
    if isinstance(first, torch.Tensor):
        return _stacked(texts)
    if isinstance(first, dict) and all(isinstance(v, torch.Tensor) for v in first.values()):
        return {k: _stacked([t[k] for t in texts]) for k in first}
    return list(texts)


class CaptionTarget(TargetKind):
    """An image's captions (module docstring).

    Args:
        field: The JSON field holding the caption(s) where the payload is JSON.
    """

    what: ClassVar[str] = "caption"

    def __init__(self, field: str = "caption") -> None:
        self.field = field
        self.num_classes = 0

    def decode(self, payload: Any, name: str) -> list[str]:
        """The image's captions (module docstring); an error naming the payload without one."""
        return read_captions(payload, name, self.field)

    def follow(self, value: Any, window: Window) -> Any:
        """The caption(s) as they are: a crop moves no word."""
        return value

    def collate(self, samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, Any]:
        """The images (one size, or padded to the largest) and their texts (:func:`collate_texts`)."""
        images, _ = padded_batch([(image, None) for image, _ in samples], 0)
        return images, collate_texts([text for _, text in samples])

    def present(self, value: Any) -> np.ndarray:
        """No class: an empty row."""
        return np.zeros(0, np.uint8)

    def mapped(self, class_map: np.ndarray | None) -> Self:
        """Captions have no class to renumber: itself."""
        return self

    def cache_key(self) -> bytes:
        """The JSON field read."""
        return self.field.encode()
