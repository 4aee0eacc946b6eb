"""Training-recipe augmentation for the DataModules' ``device_transforms`` and ``batch_transforms``.

Per-sample policies that run on a whole batch on the training device (torchvision's v2 ops, a different op and
magnitude for each sample, every draw a function of the sample's key); see the Training recipes page of the docs.
torchvision's own ``TrivialAugmentWide``, ``RandAugment`` and ``RandomErasing`` objects given to those arguments
are turned into these.
"""

from lightning_fastdata.loading.augment.policies import (
    ColorJitter,
    KeyedTransform,
    RandAugment,
    RandomErasing,
    TrivialAugmentWide,
)

__all__ = ["ColorJitter", "KeyedTransform", "RandAugment", "RandomErasing", "TrivialAugmentWide"]
