"""``CaptionRecipe``: open_clip's image pipeline as one keyed window, and each sample's caption drawn from its key.

Training (open_clip's ``image_transform(is_train=True)``): ``RandomResizedCrop(image_size, scale=(0.9, 1.0))`` and no
flip, as one window: only the crop is decoded, straight to its square (torchvision's box, its numbers drawn from the
sample's key). Evaluation: the shorter side resized to ``image_size`` and the central square (open_clip's ``Resize`` +
``CenterCrop``), one window too. The resize is this package's antialiased bilinear one (open_clip's is bicubic: the
pixels differ by that, the crop is the same).

A sample with several captions (a JSON list: COCO Captions' five) takes one, drawn from ``(seed, epoch, index)``: a
resumed run draws what the uninterrupted one did. ``text_transform`` (a tokenizer: any picklable callable of a string,
open_clip's and the hubs' among them) runs on it in the loader workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_fastdata.augment.geometry import CROP_DRAWS, center_crop_box, crop_draws, random_resized_crop_box
from lightning_fastdata.augment.keyed import uniforms
from lightning_fastdata.sources.window import Window

__all__ = ["CaptionRecipe"]

#: The keyed stream of a sample's caption choice.
_CAPTION_STREAM = 0xCA9


@dataclass(frozen=True)
class CaptionRecipe:
    """The window and caption of each sample (module docstring).

    Attributes:
        image_size: The output square's side.
        train: The training crop (else the evaluation's centre).
        scale: ``RandomResizedCrop``'s area range.
        ratio: Its aspect range.
        seed: The DataModule's seed (the caption's draw).
        text_transform: Run on the chosen caption in the workers (``None``: the string).
    """

    image_size: int = 224
    train: bool = True
    scale: tuple[float, float] = (0.9, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    seed: int = 0
    text_transform: Callable[[str], Any] | None = None

    def draws(self, seed: int, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """The crop's numbers (training), from each key alone."""
        if not self.train:
            return [None] * len(keys)
        return list(crop_draws(seed, keys))

    def window(self, draws: np.ndarray | None, width: int, height: int, value: Any) -> Window:
        """The crop (training) or the centre square (evaluation), resized to the square."""
        if self.train:
            assert draws is not None and len(draws) >= CROP_DRAWS
            box = random_resized_crop_box(draws, width, height, self.scale, self.ratio)
        else:
            box = center_crop_box(width, height, 1.0)
        size = (self.image_size, self.image_size)
        return Window(box, (0, 0, *size), size, False)

    def after(self, key: Sequence[int], image: torch.Tensor, captions: list[str]) -> tuple[torch.Tensor, Any]:
        """The image, and one of its captions (drawn from the key; the first in evaluation), transformed."""
        k = 0
        if self.train and len(captions) > 1:
            u = float(uniforms(self.seed, torch.tensor([tuple(key)], dtype=torch.int64), _CAPTION_STREAM)[0, 0])
            k = min(int(u * len(captions)), len(captions) - 1)
        text = captions[k]
        return image, text if self.text_transform is None else self.text_transform(text)
