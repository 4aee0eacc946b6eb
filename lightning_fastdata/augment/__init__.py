"""Augmentation in one room; these names are for the DataModules' ``device_transforms`` and ``batch_transforms``.

Per-sample policies that run on a whole batch on the training device (torchvision's v2 ops, a different op and
magnitude for each sample, every draw a function of the sample's key); see the Training recipes page of the docs.
torchvision's own ``TrivialAugmentWide``, ``RandAugment`` and ``RandomErasing`` objects given to those arguments
are turned into these.

The room: the keyed randomness (:mod:`.keyed`), a user's per-sample transforms in the loader workers
(:mod:`.sample`) with torchvision's policies on faster kernels (:mod:`.worker`, :mod:`.kernels`), the batched ops and
policies (:mod:`.ops`, :mod:`.batched`), normalisation (:mod:`.normalize`), the device crop of the tensor cache
(:mod:`.crop`), the device pipeline (:mod:`.pipeline`), and the one adapter to torchvision's private API
(:mod:`.torchvision_internals`).
"""

from lightning_fastdata.augment.batched import (
    ColorJitter,
    KeyedTransform,
    RandAugment,
    RandomErasing,
    TrivialAugmentWide,
)

__all__ = ["ColorJitter", "KeyedTransform", "RandAugment", "RandomErasing", "TrivialAugmentWide"]
