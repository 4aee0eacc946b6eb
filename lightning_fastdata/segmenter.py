"""``ImageSegmenter``: a LightningModule for semantic segmentation, with metrics summed exactly over ranks."""

from __future__ import annotations

from typing import Any

import torch
import torchvision
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.models import (
    _EPOCH_VALUE,
    _ProgressValues,
    check_task_model,
    evaluation_loaders,
    fused_adamw,
)
from lightning_fastdata.segmentation.target import IGNORE_INDEX

__all__ = ["SEGMENTATION_ARCHS", "ImageSegmenter", "confusion_matrix", "segmentation_scores"]

#: torchvision's segmentation builders (``torchvision.models.segmentation``).
#: The builders of ``torchvision.models.segmentation`` that ``ImageSegmenter(arch=...)`` takes.
SEGMENTATION_ARCHS: tuple[str, ...] = tuple(torchvision.models.list_models(module=torchvision.models.segmentation))


def confusion_matrix(
    predicted: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int
) -> torch.Tensor:
    """``num_classes x num_classes`` counts (int64): row the true class, column the predicted; ignored pixels left out.

    Raises:
        ValueError: If ``target`` holds a value that is neither a class nor ``ignore_index``.
    """
    keep = target != ignore_index
    t, p = target[keep].long(), predicted[keep].long()
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_classes):
        raise InvalidValueError(
            f"A mask holds the value {int(t.max())}, not a class of {num_classes} nor the ignore index {ignore_index}."
        )
    return torch.bincount(t * num_classes + p, minlength=num_classes * num_classes).view(num_classes, num_classes)


def segmentation_scores(matrix: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pixel accuracy, mean IoU and each class's IoU of a confusion matrix (:func:`confusion_matrix`).

    A class's IoU is its true positives over the pixels either the mask or the prediction gives it; ``nan`` for a
    class neither does (left out of the mean, as torchmetrics' ``MeanIoU`` with absent classes does not count).
    """
    m = matrix.double()
    tp = m.diag()
    union = m.sum(0) + m.sum(1) - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.nan)
    pixels = m.sum()
    acc = tp.sum() / pixels if pixels > 0 else m.new_tensor(torch.nan)
    miou = iou.nanmean() if bool(iou.isfinite().any()) else m.new_tensor(torch.nan)
    return {"pixel_acc": acc, "miou": miou, "iou": iou}


class ImageSegmenter(LightningModule):
    """Semantic segmentation: a torchvision segmentation model (from scratch) or any module giving ``N x C x H x W``.

    It expects ``(images, masks)`` batches: normalised float images and ``int64`` masks (``N x H x W``, class indices,
    ``ignore_index`` where no class counts), what :class:`~lightning_fastdata.SegmentationDataModule` gives on the
    device. The loss is cross-entropy with ``ignore_index`` (torchvision's reference adds 0.5 x the auxiliary head's
    loss with ``aux_loss=True``).

    Evaluation logs, over the whole epoch, ``{stage}_loss`` (per pixel), ``{stage}_pixel_acc`` and ``{stage}_miou``
    (the mean over classes of IoU, classes no pixel has nor is predicted as left out) from one confusion matrix and
    two sums, added over ranks once at the epoch's end: N ranks give one rank's figures exactly (every pixel is
    counted once; the package's evaluation loaders give each image to one rank). ``{stage}_iou_<class>`` per class
    with ``log_class_iou=True``. Training logs ``train_loss`` (the progress bar's ``loss``, read without a wait).

    ``predict_step`` returns each pixel's most likely class (``N x H x W`` uint8);
    :class:`~lightning_fastdata.MaskWriter` writes them as PNGs.

    Args:
        num_classes: Number of classes; LightningCLI links it from the DataModule.
        arch: A ``torchvision.models.segmentation`` builder name
            (:data:`~lightning_fastdata.segmenter.SEGMENTATION_ARCHS`), built without weight downloads; unused when
            ``model`` is given.
        model: Any module mapping ``N x 3 x H x W`` images to ``N x num_classes x H x W`` logits (or a dict with
            ``"out"``, as torchvision's models return); ``None``: ``arch``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        ignore_index: The mask value the loss and metrics leave out (the DataModule's).
        aux_loss: Build ``arch`` with its auxiliary head and add 0.5 x its loss (torchvision's reference).
        channels_last: Run the model in channels-last memory format.
        class_names: Each class's name, kept in the checkpoint; LightningCLI links it from the DataModule.
        log_class_iou: Also log each class's IoU in evaluation.

    Raises:
        ValueError: If ``num_classes`` is not positive or ``arch`` is not a torchvision segmentation model.
    """

    def __init__(
        self,
        num_classes: int,
        arch: str = "lraspp_mobilenet_v3_large",
        model: nn.Module | None = None,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
        ignore_index: int = IGNORE_INDEX,
        aux_loss: bool = False,
        channels_last: bool = False,
        class_names: list[str] | None = None,
        log_class_iou: bool = False,
    ) -> None:
        super().__init__()
        check_task_model(num_classes, class_names, arch if model is None else None, SEGMENTATION_ARCHS,
                         "segmentation", "any module returning N x C x H x W logits")  # fmt: skip
        save_init_hparams(self)
        if model is None:
            extra = {"aux_loss": True} if aux_loss else {}
            model = torchvision.models.get_model(
                arch, weights=None, weights_backbone=None, num_classes=num_classes, **extra
            )
        self.model: nn.Module = model
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self._sums: dict[tuple[str, int], torch.Tensor] = {}
        self._progress = _ProgressValues()

    @property
    def class_names(self) -> list[str] | None:
        """The classes' names, as given (and kept in the checkpoint), or ``None``."""
        names = self.hparams.get("class_names")
        return None if names is None else list(names)

    def _outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.hparams["channels_last"]:
            images = images.contiguous(memory_format=torch.channels_last)
        out = self.model(images)
        if isinstance(out, dict):
            return out["out"], out.get("aux")
        return out, None

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Per-pixel class logits, ``N x num_classes x H x W``."""
        return self._outputs(images)[0]

    def _loss(self, logits: torch.Tensor, masks: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if logits.shape[-2:] != masks.shape[-2:] or logits.shape[1] != self.num_classes:
            raise InvalidValueError(
                f"The model gave logits of shape {tuple(logits.shape)} for masks of shape {tuple(masks.shape)}: a "
                f"segmentation model returns N x {self.num_classes} x H x W at the masks' size."
            )
        return nn.functional.cross_entropy(logits, masks, ignore_index=self.ignore_index, reduction=reduction)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy over every counted pixel (+ 0.5 x the auxiliary head's)."""
        images, masks = batch[0], batch[1]
        out, aux = self._outputs(images)
        loss = self._loss(out, masks)
        if aux is not None and self.hparams["aux_loss"]:
            loss = loss + 0.5 * self._loss(aux, masks)
        for name, value in self._progress({"train_loss": loss}).items():
            self.log(name.removeprefix("train_"), value, prog_bar=True, logger=False, batch_size=len(images))
        self.log("train_loss", loss, batch_size=len(images))
        return loss

    def _evaluate(self, batch: Any, stage: str, loader: int) -> None:
        images, masks = batch[0], batch[1]
        logits = self(images)
        loss_sum = self._loss(logits.float(), masks, reduction="sum")
        counted = (masks != self.ignore_index).sum()
        matrix = confusion_matrix(logits.argmax(dim=1), masks, self.num_classes, self.ignore_index)
        row = torch.cat([torch.stack([loss_sum.detach().double(), counted.double()]), matrix.view(-1).double()])
        self._sums[stage, loader] = self._sums.get((stage, loader), 0) + row

    def _log_evaluation(self, stage: str) -> None:
        count = evaluation_loaders(self, stage)
        c = self.num_classes
        for loader in range(count):
            suffix = f"/dataloader_idx_{loader}" if count > 1 else ""
            row = self._sums.pop((stage, loader), None)
            if row is None:  # this rank had no batch: it still takes part in the reduction
                row = torch.zeros(2 + c * c, dtype=torch.float64, device=self.device)
            total = self.trainer.strategy.reduce(row, reduce_op="sum")  # counts below 2^53: exact in float64
            if float(total[1]) == 0:  # said, and logged as NaN: a monitor of these names must not find them missing
                rank_zero_warn(
                    f"Every pixel of the {stage} masks{suffix.replace('/', ' ')} is the ignore index "
                    f"({self.ignore_index}): no loss, accuracy or IoU to compute. Check what the mask values mean "
                    "(label_map=, num_classes=, ignore_index=)."
                )
                for name in ("loss", "pixel_acc", "miou"):
                    self.log(f"{stage}_{name}{suffix}", float("nan"), **_EPOCH_VALUE)
                continue
            scores = segmentation_scores(total[2:].view(c, c))
            self.log(f"{stage}_loss{suffix}", (total[0] / total[1]).float(), prog_bar=True, **_EPOCH_VALUE)
            self.log(f"{stage}_pixel_acc{suffix}", scores["pixel_acc"].float(), **_EPOCH_VALUE)
            self.log(f"{stage}_miou{suffix}", scores["miou"].float(), prog_bar=True, **_EPOCH_VALUE)
            if self.hparams["log_class_iou"]:
                names = self.class_names or [str(k) for k in range(c)]
                for name, value in zip(names, scores["iou"]):
                    if bool(value.isfinite()):
                        self.log(f"{stage}_iou_{name}{suffix}", value.float(), **_EPOCH_VALUE)

    @override
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Adds the batch's loss, counted pixels and confusion matrix to the epoch's sums."""
        self._evaluate(batch, "val", dataloader_idx)

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    @override
    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """As validation: ``test_loss``, ``test_pixel_acc``, ``test_miou``."""
        self._evaluate(batch, "test", dataloader_idx)

    @override
    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    #: What :meth:`predict_step` returns (the prediction writers read it).
    prediction_scores = "masks"

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Each pixel's most likely class, ``N x H x W`` uint8 (at the batch's size, padding included)."""
        return self(batch[0]).argmax(dim=1).to(torch.uint8)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters (fused where torch has the kernel)."""
        return fused_adamw(self, self.hparams["lr"], self.hparams["weight_decay"])
