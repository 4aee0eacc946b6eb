"""A small image classifier so that the demo and the configs have a model to train."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torchvision
from lightning.pytorch import LightningModule
from torch import nn
from typing_extensions import override

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams

__all__ = ["ImageClassifier", "average_precision", "check_task_model", "evaluation_loaders", "fused_adamw"]

#: How an evaluation epoch's values are logged: the same on every rank already (``sync_dist`` averages equal values,
#: and keeps Lightning from warning of an unsynced epoch value), named by the model (``/dataloader_idx_k`` added by
#: :meth:`ImageClassifier._log_evaluation` only with several loaders).
_EPOCH_VALUE: dict[str, Any] = {"sync_dist": True, "add_dataloader_idx": False}


class ImageClassifier(LightningModule):
    """A torchvision architecture built from scratch (no weight download), trained with cross-entropy.

    It expects ``(images, labels)`` batches whose images are already normalised float (the package's
    DataModules do that on the device, after transfer). ``labels`` are class indices, or soft targets (``N x C``
    probabilities, what MixUp and CutMix make); accuracy is then measured against each sample's largest target.

    With ``multi_label=True`` each sample may have several classes: ``labels`` are multi-hot rows (``N x C``, 0/1,
    or soft after MixUp), the loss is binary cross-entropy on each class's logit, and evaluation logs
    ``{stage}_loss``, ``{stage}_map`` (mean over classes of the average precision, classes without a positive
    left out) and ``{stage}_f1`` (micro F1 of the classes whose probability is above 0.5), computed over the whole
    epoch: every rank's scores are gathered (``N x C`` floats on the device), so N ranks give one rank's figures.

    Training logs ``train_loss`` and ``train_acc`` (exact, each step, for the logger and callbacks such as
    ``ModelCheckpoint(monitor="train_loss")``); the progress bar shows them as ``loss`` and ``acc``, on a GPU from
    the newest step the GPU has finished (usually the previous one), so that showing them never makes the host wait
    for the GPU: a wait every step would keep the host from preparing the next batch while the GPU trains.

    Args:
        num_classes: Number of classes; LightningCLI links it from the DataModule.
        arch: A ``torchvision.models`` builder name, e.g. ``"resnet18"``, ``"resnet50"``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        channels_last: Run the model in channels-last memory format (faster convolutions on GPU).
        label_smoothing: ``nn.CrossEntropyLoss``'s (0.1 in torchvision's reference recipe); training loss only.
        class_names: The name of each class, in label order; kept in the checkpoint (its hyperparameters), so a
            prediction table names classes without the training data (LightningCLI links it from the DataModule's
            ``classes``). ``None``: unnamed.
        multi_label: Several classes per sample (see above); LightningCLI links it from the DataModule.

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
        class_names: list[str] | None = None,
        multi_label: bool = False,
    ) -> None:
        super().__init__()
        if num_classes <= 0:
            raise InvalidValueError(f"num_classes should be a positive int, got {num_classes!r}.")
        if class_names is not None and len(class_names) != num_classes:
            raise InvalidValueError(
                f"class_names has {len(class_names)} names for num_classes={num_classes}; give one name per class, in "
                "label order (the DataModule's classes)."
            )
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
        # per (stage, dataloader index): the epoch's sums, and (multi-label) its scores and targets
        self._evaluation_sums: dict[tuple[str, int], torch.Tensor] = {}
        self._scores: dict[tuple[str, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._progress = _ProgressValues()

    @property
    def class_names(self) -> list[str] | None:
        """The classes' names in label order, as given (and kept in the checkpoint), or ``None``."""
        names = self.hparams.get("class_names")
        return None if names is None else list(names)

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Return class logits."""
        if self.hparams["channels_last"]:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.model(images)

    def _shared_step(self, batch: Any, stage: str, loader: int = 0) -> torch.Tensor:
        images, labels = batch[0], batch[1]
        logits = self(images)
        if self.hparams.get("multi_label"):
            return self._multi_label_step(logits, labels, stage, loader)
        loss = (self.train_loss if stage == "train" else self.loss)(logits, labels)
        classes = labels.argmax(dim=1) if labels.is_floating_point() else labels  # soft targets: the largest
        hits = logits.argmax(dim=1) == classes
        if stage == "train":
            self._log_train(len(labels), train_loss=loss, train_acc=hits.float().mean())
            return loss
        # evaluation: sums over the epoch, reduced over ranks once at its end (:meth:`_log_evaluation`)
        top5 = (logits.topk(min(5, logits.shape[1]), dim=1).indices == classes.view(-1, 1)).any(dim=1)
        n = len(labels)
        row = torch.stack([loss.detach().double() * n, hits.sum().double(), top5.sum().double()])
        row = torch.cat([row, row.new_tensor([n])])
        self._evaluation_sums[stage, loader] = self._evaluation_sums.get((stage, loader), 0) + row
        return loss

    def _log_train(self, n: int, **values: torch.Tensor) -> None:
        """The step's ``train_*`` values, exact, for the logger and callbacks; for the progress bar without a wait.

        The bar shows them as ``loss`` and ``acc`` (:class:`_ProgressValues`: on a GPU, the newest step's the GPU
        has finished).
        """
        for name, value in values.items():
            self.log(name, value, batch_size=n)
        for name, value in self._progress(values).items():
            self.log(name.removeprefix("train_"), value, prog_bar=True, logger=False, batch_size=n)

    def _multi_label_step(self, logits: torch.Tensor, labels: torch.Tensor, stage: str, loader: int) -> torch.Tensor:
        if labels.dim() != 2 or labels.shape[1] != logits.shape[1]:
            raise InvalidValueError(
                f"multi_label=True takes multi-hot labels (N x {logits.shape[1]}), got shape {tuple(labels.shape)}: "
                "use a DataModule with multi_label=True (a label table with several labels per image)."
            )
        targets = labels.to(logits.dtype)
        smoothing = self.hparams["label_smoothing"] if stage == "train" else 0.0
        loss = nn.functional.binary_cross_entropy_with_logits(logits, targets * (1 - smoothing) + smoothing / 2)
        if stage == "train":
            self._log_train(len(labels), train_loss=loss)
            return loss
        self._scores.setdefault((stage, loader), []).append(
            (logits.detach().float().sigmoid(), targets.detach().float())
        )
        return loss

    def _log_multi_label(self, stage: str, loader: int, suffix: str) -> None:
        """``{stage}_loss``, ``{stage}_map`` and ``{stage}_f1`` over every rank's scores of the epoch."""
        parts = self._scores.pop((stage, loader), [])
        classes = int(self.hparams["num_classes"])
        scores = torch.cat([p for p, _ in parts]) if parts else torch.zeros(0, classes, device=self.device)
        targets = torch.cat([t for _, t in parts]) if parts else torch.zeros(0, classes, device=self.device)
        if self.trainer.world_size > 1:
            scores, targets = _gather_rows(self, scores), _gather_rows(self, targets)
        if not len(scores):
            return
        p = scores.double().clamp(1e-12, 1 - 1e-12)
        t = targets.double()
        loss = -(t * p.log() + (1 - t) * (1 - p).log()).mean()
        ap = average_precision(scores, targets)
        predicted = scores > 0.5
        tp = (predicted & (targets > 0.5)).sum()
        f1 = 2 * tp / (predicted.sum() + (targets > 0.5).sum()).clamp(min=1)
        # the same value on every rank already (sync_dist keeps Lightning from warning of an unsynced epoch value)
        kw = _EPOCH_VALUE
        self.log(f"{stage}_loss{suffix}", loss.float(), prog_bar=True, **kw)
        self.log(f"{stage}_map{suffix}", ap.nanmean().float() if ap.isfinite().any() else ap.new_tensor(0.0), **kw)
        self.log(f"{stage}_f1{suffix}", f1.float(), prog_bar=True, **kw)

    def _log_evaluation(self, stage: str) -> None:
        """Log ``{stage}_loss``, ``{stage}_acc`` (and ``{stage}_acc_top5`` above 5 classes) over the whole epoch.

        Sums of the epoch's losses, hits and samples, added over ranks (every sample is evaluated on exactly one
        rank), then divided: the metrics of N ranks equal one rank's. (Lightning's own ``sync_dist`` mean divides
        the sample count, an integer, by the world size with integer division, which is off whenever the ranks'
        total count is odd.) With several loaders (a ``MixedDataModule``'s sources), each loader's metrics apart,
        named ``{stage}_acc/dataloader_idx_{k}`` as Lightning names them.
        """
        count = evaluation_loaders(self, stage)
        for loader in range(count):
            suffix = f"/dataloader_idx_{loader}" if count > 1 else ""
            if self.hparams.get("multi_label"):
                self._log_multi_label(stage, loader, suffix)
            else:
                self._log_sums(stage, loader, suffix)

    def _log_sums(self, stage: str, loader: int, suffix: str) -> None:
        row = self._evaluation_sums.pop((stage, loader), None)
        if row is None:  # this rank had no batch: it still takes part in the reduction
            row = torch.zeros(4, dtype=torch.float64, device=self.device)
        total = self.trainer.strategy.reduce(row, reduce_op="sum")
        if float(total[3]) == 0:
            return
        # the same value on every rank already; sync_dist averages equal values (exact), and without it Lightning
        # warns that an epoch-level value is not synced
        kw = _EPOCH_VALUE
        self.log(f"{stage}_loss{suffix}", total[0] / total[3], prog_bar=True, **kw)
        self.log(f"{stage}_acc{suffix}", total[1] / total[3], prog_bar=True, **kw)
        if self.hparams["num_classes"] > 5:
            self.log(f"{stage}_acc_top5{suffix}", total[2] / total[3], **kw)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        return self._shared_step(batch, "train")

    @override
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Validation loss, top-1 and (more than 5 classes) top-5 accuracy, logged over the epoch."""
        self._shared_step(batch, "val", dataloader_idx)

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    @override
    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Test loss, top-1 and (more than 5 classes) top-5 accuracy: ``test_loss``, ``test_acc``, ``test_acc_top5``."""
        self._shared_step(batch, "test", dataloader_idx)

    @override
    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    @property
    def prediction_scores(self) -> str:
        """What :meth:`predict_step`'s rows are (``PredictionWriter`` writes them as they are)."""
        return "multi_label_probabilities" if self.hparams.get("multi_label") else "probabilities"

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Class probabilities of a batch's images, ``N x num_classes`` (:attr:`prediction_scores` says which).

        The softmax of the logits, or with ``multi_label`` each class's sigmoid.
        """
        logits = self(batch[0]).float()
        return logits.sigmoid() if self.hparams.get("multi_label") else logits.softmax(dim=1)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters, fused where torch has the fused kernel (CUDA and CPU parameters).

        The fused step is a few launches; torch's default (``foreach``) makes ~15 multi-tensor launches and reads
        two numbers per parameter on the host each step: ~2 ms of the training thread's time per step for
        ResNet-50's 161 parameters (0.55 ms fused, on this package's 2-core VM), and a fed GPU run is bound by that
        thread. The same update either way (tested).
        """
        return fused_adamw(self, self.hparams["lr"], self.hparams["weight_decay"])


class _ProgressValues:
    """A training step's values for the progress bar, read without making the host wait for the device.

    Lightning turns every progress-bar value into a Python number after every training step. For a tensor on a GPU
    that is a wait for everything queued before it, the whole step: the host cannot prepare the next batch (fetch,
    transfer, the device augmentation's launches) while the GPU trains on this one. Here the values are copied to
    pinned host memory without a wait, and the bar gets the newest copy the GPU has finished (usually the previous
    step's; its event is asked, never waited on). On a CPU: the step's own values.
    """

    def __init__(self) -> None:
        self._pending: deque[tuple[list[str], torch.Tensor, torch.cuda.Event]] = deque()

    def __call__(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the bar shows after this step: ``values`` (CPU), the newest finished copy (GPU), or nothing yet."""
        if next(iter(values.values())).device.type != "cuda":
            return {name: value.detach() for name, value in values.items()}
        stacked = torch.stack([value.detach().float() for value in values.values()])
        host = torch.empty(stacked.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(stacked, non_blocking=True)  # the pinned block is not reused before the copy is done
        done = torch.cuda.Event()
        done.record()
        self._pending.append((list(values), host, done))
        shown: dict[str, torch.Tensor] = {}
        while self._pending and self._pending[0][2].query():
            names, copied, _ = self._pending.popleft()
            shown = dict(zip(names, copied.unbind()))
        return shown

    def __getstate__(self) -> dict[str, Any]:
        return {"_pending": deque()}  # a copy of the model (pickled, deep-copied) starts without copies in flight


def check_task_model(
    num_classes: int, class_names: list[str] | None, arch: str | None, archs: tuple[str, ...], task: str, model: str
) -> None:
    """A task model's arguments checked: a positive class count, as many names, an ``arch`` among ``archs``.

    ``arch``: ``None`` where a ``model`` is given (``task``: torchvision's family, ``model``: what else it takes).

    Raises:
        ValueError: Naming the argument and what it takes.
    """
    if num_classes <= 0:
        raise InvalidValueError(f"num_classes should be a positive int, got {num_classes!r}.")
    if class_names is not None and len(class_names) != num_classes:
        raise InvalidValueError(f"class_names has {len(class_names)} names for num_classes={num_classes}.")
    if arch is not None and arch not in archs:
        raise InvalidValueError(
            f"arch {arch!r} is not a torchvision {task} model; one of {', '.join(archs)}, or pass model= ({model})."
        )


def fused_adamw(module: LightningModule, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over ``module``'s trainable parameters, fused where torch has the fused kernel (CUDA and CPU)."""
    params = [p for p in module.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cuda", "cpu") and p.is_floating_point() for p in params) or None
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


def evaluation_loaders(module: LightningModule, stage: str) -> int:
    """How many loaders the ``"val"`` or ``"test"`` epoch of ``module``'s trainer reads (a mix's sources: several)."""
    loaders = module.trainer.val_dataloaders if stage == "val" else module.trainer.test_dataloaders
    return len(loaders) if isinstance(loaders, (list, tuple)) else 1


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each class's average precision (``C`` values; ``nan`` for a class without a positive).

    The mean, over a class's positives, of the precision at the rank of each one, samples ranked by score (ties
    in the order given).

    Args:
        scores: ``N x C`` scores (higher: more likely).
        targets: ``N x C`` 0/1 targets (above 0.5 counts as positive).
    """
    order = scores.argsort(dim=0, descending=True, stable=True)
    hits = (targets > 0.5).gather(0, order).double()
    precision = hits.cumsum(0) / torch.arange(1, len(hits) + 1, device=hits.device, dtype=hits.dtype).view(-1, 1)
    positives = hits.sum(0)
    return torch.where(positives > 0, (precision * hits).sum(0) / positives.clamp(min=1), torch.nan)


def _gather_rows(module: LightningModule, rows: torch.Tensor) -> torch.Tensor:
    """Every rank's ``rows`` (``n_r x C``, ``n_r`` may differ), concatenated in rank order."""
    counts = torch.as_tensor(module.all_gather(torch.tensor(len(rows), device=rows.device))).view(-1)
    longest = int(counts.max())
    padded = torch.cat([rows, rows.new_zeros(longest - len(rows), *rows.shape[1:])])
    gathered = torch.as_tensor(module.all_gather(padded))
    return torch.cat([gathered[r, : int(n)] for r, n in enumerate(counts)])
