"""How tests check that masks follow their images: on the demo scenes a pixel's class is its colour."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lightning_fastdata.segmentation.demos import classes_of_colours
from lightning_fastdata.segmentation.layouts import MaskLayout
from lightning_fastdata.segmentation.target import IGNORE_INDEX, MaskTarget
from lightning_fastdata.sources.folder import PairedFolderDataset
from lightning_fastdata.sources.hdf5 import PairedHDF5Dataset


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


def mask_folder(
    root: Any,
    split: str,
    num_classes: int = 21,
    label_map: Any = None,
    ignore_index: int = IGNORE_INDEX,
    layout: str = "auto",
    images_dir: str = "images",
    masks_dir: str = "annotations",
    **windows: Any,
) -> PairedFolderDataset:
    """A folder source of images and masks: the folder source composed with the mask target and a mask layout."""
    target = MaskTarget(num_classes, ignore_index, label_map)
    return PairedFolderDataset(root, split, target, MaskLayout(layout, images_dir, masks_dir), **windows)


def mask_hdf5(
    path: Any, group: str, num_classes: int = 21, masks_key: str = "masks", **windows: Any
) -> PairedHDF5Dataset:
    """An HDF5 source of images and masks (the masks dataset ``masks_key``) with the mask target."""
    return PairedHDF5Dataset(path, group, MaskTarget(num_classes), "images", masks_key, **windows)
