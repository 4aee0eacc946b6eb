"""How tests check that masks follow their images: on the demo scenes a pixel's class is its colour."""

from __future__ import annotations

import numpy as np
import torch

from lightning_fastdata.segmentation.demos import classes_of_colours
from lightning_fastdata.segmentation.window import IGNORE_INDEX


def agreement(images: torch.Tensor, masks: torch.Tensor, margin: int = 3) -> tuple[int, int]:
    """(interior pixels whose mask is their image's class, interior pixels) over a uint8 batch.

    Interior: not ignored, and the same class ``margin`` pixels around (away from the shapes' edges, where a resize
    blends colours).
    """
    agree = total = 0
    for image, mask in zip(images.numpy(), masks.numpy()):
        h, w = mask.shape
        padded = np.pad(mask.astype(np.int32), margin, constant_values=-1)
        keep = mask != IGNORE_INDEX
        for dy in range(2 * margin + 1):
            for dx in range(2 * margin + 1):
                keep &= padded[dy : dy + h, dx : dx + w] == mask
        agree += int((classes_of_colours(image)[keep] == mask[keep]).sum())
        total += int(keep.sum())
    return agree, total
