"""A small image classifier so that the demo and the configs have a model to train."""

from __future__ import annotations

from typing import Any

import torch
import torchvision
from lightning.pytorch import LightningModule
from torch import nn
from typing_extensions import override

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams

__all__ = ["ImageClassifier"]


class ImageClassifier(LightningModule):
    """A torchvision architecture built from scratch (no weight download), trained with cross-entropy.

    It expects ``(images, labels)`` batches whose images are already normalised float (the package's
    DataModules do that on the device, after transfer). ``labels`` are class indices, or soft targets (``N x C``
    probabilities, what MixUp and CutMix make); accuracy is then measured against each sample's largest target.

    Args:
        num_classes: Number of classes; LightningCLI links it from the DataModule.
        arch: A ``torchvision.models`` builder name, e.g. ``"resnet18"``, ``"resnet50"``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        channels_last: Run the model in channels-last memory format (faster convolutions on GPU).
        label_smoothing: ``nn.CrossEntropyLoss``'s (0.1 in torchvision's reference recipe); training loss only.

    Raises:
        ValueError: If ``num_classes`` is not positive or ``arch`` is not a torchvision model.
    """

    def __init__(
        self,
        num_classes: int,
        arch: str = "resnet18",
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
        channels_last: bool = False,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if num_classes <= 0:
            raise InvalidValueError(f"num_classes should be a positive int, got {num_classes!r}.")
        if arch not in torchvision.models.list_models(module=torchvision.models):
            raise InvalidValueError(f"arch {arch!r} is not a torchvision classification model; try 'resnet18'.")
        if not 0 <= label_smoothing < 1:
            raise InvalidValueError(f"label_smoothing should be in [0, 1), got {label_smoothing!r}.")
        save_init_hparams(self)
        self.model: nn.Module = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.loss = nn.CrossEntropyLoss()
        self.train_loss = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Return class logits."""
        if self.hparams["channels_last"]:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.model(images)

    def _shared_step(self, batch: Any, stage: str) -> torch.Tensor:
        images, labels = batch[0], batch[1]
        logits = self(images)
        loss = (self.train_loss if stage == "train" else self.loss)(logits, labels)
        classes = labels.argmax(dim=1) if labels.is_floating_point() else labels  # soft targets: the largest
        acc = (logits.argmax(dim=1) == classes).float().mean()
        self.log(f"{stage}_loss", loss, prog_bar=True, batch_size=len(labels), sync_dist=stage != "train")
        self.log(f"{stage}_acc", acc, prog_bar=True, batch_size=len(labels), sync_dist=stage != "train")
        return loss

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        return self._shared_step(batch, "train")

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """Validation loss and accuracy."""
        self._shared_step(batch, "val")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters."""
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])
