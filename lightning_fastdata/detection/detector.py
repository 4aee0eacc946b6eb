"""``ObjectDetector``: a LightningModule that trains torchvision's detection models on ``DetectionDataModule``.

A batch on the device is ``(images, targets)``: a list of normalised float images (each at its own size) and a list
of torchvision's target dicts (``boxes`` float32 XYXY in the image's pixels, ``labels`` int64 ``0 ..
num_classes - 1``, ``iscrowd``), what :class:`~lightning_fastdata.DetectionDataModule` gives. torchvision's detection
models keep label 0 for the background: the module builds them with ``num_classes + 1`` outputs and shifts the
labels by one on the way in and back on the way out, so the data's labels and the predictions' are the module's
classes.

Evaluation logs COCO's mean average precision (``{stage}_map``, ``{stage}_map_50``, ``{stage}_map_75``) over the whole
epoch with torchmetrics' ``MeanAveragePrecision`` (the ``pycocotools`` backend: ``pip install pycocotools``); crowd
boxes are the evaluation's ``iscrowd`` (matched, never counted as missed), as COCO's evaluation does. Each image's
detections and targets are kept on the host and gathered from every rank at the epoch's end, in one order whatever
the ranks: N ranks give one rank's figures exactly (the package's evaluation loaders give each image to one rank).
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision
from lightning.pytorch import LightningModule
from torch import nn
from typing_extensions import override

from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.models import _EPOCH_VALUE, check_task_model, fused_adamw

__all__ = ["DETECTION_ARCHS", "ObjectDetector"]

#: The builders of ``torchvision.models.detection`` that ``ObjectDetector(arch=...)`` takes.
DETECTION_ARCHS: tuple[str, ...] = tuple(torchvision.models.list_models(module=torchvision.models.detection))

Targets = list[dict[str, torch.Tensor]]


def _shifted(targets: Targets, by: int) -> Targets:
    return [{**t, "labels": t["labels"] + by} for t in targets]


class ObjectDetector(LightningModule):
    """Object detection with a torchvision detection model, from scratch (module docstring).

    Args:
        num_classes: Number of classes (the background not counted); LightningCLI links it from the DataModule.
        arch: A ``torchvision.models.detection`` builder name, built without weight
            downloads (``DETECTION_ARCHS``); unused when ``model`` is given.
        model: A module that behaves as torchvision's detection models (training: ``model(images, targets)`` gives
            a dict of losses; evaluation: ``model(images)`` a list of ``boxes``/``labels``/``scores`` dicts), its
            labels ``1 .. num_classes`` (0: the background); ``None``: ``arch``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        class_names: Each class's name, kept in the checkpoint; LightningCLI links it from the DataModule.

    Raises:
        ValueError: If ``num_classes`` is not positive or ``arch`` is not a torchvision detection model.
    """

    def __init__(
        self,
        num_classes: int,
        arch: str = "fasterrcnn_mobilenet_v3_large_320_fpn",
        model: nn.Module | None = None,
        lr: float = 1e-4,
        weight_decay: float = 1e-4,
        class_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        check_task_model(num_classes, class_names, arch if model is None else None, DETECTION_ARCHS, "detection",
                         "a module that behaves as torchvision's detection models")  # fmt: skip
        save_init_hparams(self)
        if model is None:
            model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=num_classes + 1)
        self.model: nn.Module = model
        self.num_classes = num_classes
        self._records: dict[str, list[dict[str, torch.Tensor]]] = {}

    @override
    def forward(self, images: list[torch.Tensor]) -> Targets:
        """The detections of each image (eval mode): ``boxes``, ``labels`` (``0 .. num_classes - 1``), ``scores``."""
        return _shifted(self.model(images), -1)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """The sum of the model's losses (each logged as ``train_<name>``)."""
        images, targets = batch[0], batch[1]  # (images, targets), or a padded batch (its image_sizes third)
        losses = self.model(images, _shifted(targets, 1))
        loss = sum(losses.values())
        for name, value in losses.items():
            self.log(f"train_{name}", value.detach(), batch_size=len(images))
        self.log("train_loss", loss.detach(), prog_bar=True, batch_size=len(images))
        return loss

    def _evaluate(self, batch: Any, stage: str) -> None:
        images, targets = batch[0], batch[1]
        for d, t in zip(self(images), targets):  # kept on the host: gathered from every rank at the epoch's end
            record = {f"d_{k}": d[k].detach().cpu() for k in ("boxes", "scores", "labels")}
            record.update({f"t_{k}": t[k].detach().cpu() for k in ("boxes", "labels", "iscrowd")})
            self._records.setdefault(stage, []).append(record)

    def _gathered(self, stage: str) -> list[dict[str, torch.Tensor]]:
        """Every rank's images' records, in one order whatever the ranks (sorted by their content)."""
        records = self._records.pop(stage, [])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            parts: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, records)
            records = [r for part in parts for r in part]
        return sorted(records, key=lambda r: b"".join(r[k].numpy().tobytes() for k in sorted(r)))

    def evaluation_scores(self, stage: str) -> dict[str, torch.Tensor]:
        """COCO's figures of the ``stage`` epoch's images on every rank (torchmetrics' names: ``map``, ``map_50``, ...).

        Raises:
            ModuleNotFoundError: Without ``pycocotools`` (named).
        """
        try:
            from torchmetrics.detection import MeanAveragePrecision

            metric = MeanAveragePrecision(box_format="xyxy", backend="pycocotools", sync_on_compute=False)
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError("ObjectDetector's COCO mAP needs pycocotools: pip install pycocotools") from err
        records = self._gathered(stage)  # every rank computes the same figures from the same images, each once
        metric.update(
            [{"boxes": r["d_boxes"], "scores": r["d_scores"], "labels": r["d_labels"]} for r in records],
            [{"boxes": r["t_boxes"], "labels": r["t_labels"], "iscrowd": r["t_iscrowd"].long()} for r in records],
        )
        return metric.compute()

    def _log_evaluation(self, stage: str) -> None:
        scores = self.evaluation_scores(stage)
        for name in ("map", "map_50", "map_75"):
            self.log(f"{stage}_{name}", scores[name].float(), prog_bar=name == "map", **_EPOCH_VALUE)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """Adds the batch's detections and targets to the epoch's mAP."""
        self._evaluate(batch, "val")

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        """As validation: ``test_map``, ``test_map_50``, ``test_map_75``."""
        self._evaluate(batch, "test")

    @override
    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> Targets:
        """Each image's detections (``boxes``, ``labels`` in the data's classes, ``scores``) in its own pixels.

        ``batch``: the module's predict batch (the images, their indices and sizes: boxes on a resized image are
        scaled back to the original's), or ``(images, ...)``.
        """
        images = batch.images if hasattr(batch, "images") else batch[0]
        detections = self(images)
        sizes = getattr(batch, "sizes", None)
        if sizes is not None:
            for d, (h, w, placed_h, placed_w) in zip(detections, sizes.tolist()):
                d["boxes"] = d["boxes"] * d["boxes"].new_tensor([w / placed_w, h / placed_h] * 2)
        return detections

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters (fused where torch has the kernel)."""
        return fused_adamw(self, self.hparams["lr"], self.hparams["weight_decay"])
