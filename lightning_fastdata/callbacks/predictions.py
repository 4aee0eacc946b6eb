"""``PredictionWriter``: ``trainer.predict``'s results as one table, in the order of the input list, over all ranks."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_path

__all__ = ["SCORE_KINDS", "PredictionWriter", "ScoreKind", "each_input_once", "gathered_on_zero"]

#: What a ``predict_step``'s ``N x C`` rows are: class probabilities (each row sums to one), logits (a softmax makes
#: them probabilities), each class's own probability (several labels per image), or each class's logit (a sigmoid).
ScoreKind = Literal["probabilities", "logits", "multi_label_probabilities", "multi_label_logits"]
SCORE_KINDS: tuple[str, ...] = get_args(ScoreKind)


def _score_kind(value: Any, what: str) -> str:
    if value not in SCORE_KINDS:
        raise InvalidValueError(f"{what} should be one of {', '.join(map(repr, SCORE_KINDS))}, got {value!r}.")
    return str(value)


class PredictionWriter(BasePredictionWriter):
    """Write each image's top-k classes and probabilities to one CSV file, in the order of the input list.

    Works with the package's DataModules given ``predict_root``: a predict batch is ``(images, indices)``, and
    each row names its image by ``datamodule.predict_path(index)`` and its classes by ``datamodule.classes`` (else the
    model's ``class_names``, which ``ImageClassifier`` keeps in its checkpoint).

    The model's ``predict_step`` returns a score per class, and what those scores are is said, never guessed
    (``ScoreKind``): by ``scores=``, else by the model's ``prediction_scores`` attribute (``ImageClassifier``
    says ``"probabilities"``, or ``"multi_label_probabilities"`` with ``multi_label=True``). Probabilities are written
    as the model gives them; logits become probabilities by a softmax (``"logits"``) or each class's sigmoid
    (``"multi_label_logits"``). Only the top ``top_k`` of each row are kept while predicting, copied to the host
    without waiting for the device (one wait at the end of the epoch); then every rank's rows are gathered, checked
    (each input exactly once), sorted by index and written by rank zero, atomically (a temporary name, then a
    rename: a run that dies leaves the old table or none, never half of one).

    Columns: ``path``, then ``class_1``, ``prob_1`` ... ``class_k``, ``prob_k`` (most probable first).

    Args:
        output: The CSV file to write (its folder is created); overwritten by each ``trainer.predict``.
        top_k: Classes per image (at most the number of classes).
        scores: What ``predict_step``'s rows are; ``None``: what the model's ``prediction_scores`` says.

    Raises:
        ValueError: If ``top_k`` is not positive or ``scores`` is not a ``ScoreKind``; at the start of
            ``trainer.predict``, if neither ``scores=`` nor the model says what its rows are.
    """

    def __init__(self, output: str, top_k: int = 5, scores: ScoreKind | None = None) -> None:
        super().__init__(write_interval="batch")
        if not isinstance(top_k, int) or top_k < 1:
            raise InvalidValueError(f"top_k should be a positive int, got {top_k!r}.")
        self.output = os.fspath(output)
        self.top_k = top_k
        self.scores = None if scores is None else _score_kind(scores, "scores")
        self._kind: str = "probabilities"
        self._rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @override
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._rows = []
        said = getattr(pl_module, "prediction_scores", None)
        if self.scores is None and said is None:
            raise InvalidValueError(
                f"PredictionWriter does not know what {type(pl_module).__name__}.predict_step returns: pass "
                f"PredictionWriter(scores=...) ({', '.join(map(repr, SCORE_KINDS))}), or give the model a "
                "prediction_scores attribute saying it."
            )
        if self.scores is None and said == "masks":
            raise InvalidValueError(
                f"{type(pl_module).__name__}.predict_step returns masks, not class scores: use MaskWriter (PNG masks "
                "and a table of them) instead of PredictionWriter."
            )
        self._kind = self.scores or _score_kind(said, f"{type(pl_module).__name__}.prediction_scores")

    @override
    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Keep the batch's top-k classes and probabilities, by input index."""
        scores = prediction["probs"] if isinstance(prediction, dict) else prediction
        if not isinstance(scores, torch.Tensor) or scores.ndim != 2:
            raise InvalidValueError(
                "PredictionWriter needs predict_step to return an N x C tensor of class scores (or a dict with "
                f"'probs'), got {type(scores).__name__}{'' if not hasattr(scores, 'shape') else tuple(scores.shape)}."
            )
        scores = scores.detach().float()
        if self._kind == "logits":
            scores = scores.softmax(dim=1)
        elif self._kind == "multi_label_logits":
            scores = scores.sigmoid()
        p, c = scores.topk(min(self.top_k, scores.shape[1]), dim=1)
        # to the host without a wait for the device (pinned, in stream order); read once, at the epoch's end
        indices = getattr(batch, "indices", None)
        indices = batch[1] if indices is None else indices  # a PredictBatch names it; a plain tuple's second field
        self._rows.append(tuple(t.to("cpu", non_blocking=True, copy=True) for t in (indices, c, p)))  # type: ignore[arg-type]

    @override
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Gather every rank's rows and write the table on rank zero."""
        super().on_predict_epoch_end(trainer, pl_module)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the one wait: every batch's copies to the host are done after it
        mine = _join([(i.numpy().astype(np.int64), c.numpy(), p.numpy()) for i, c, p in self._rows])
        self._rows = []
        if self._kind.endswith("probabilities") and mine[2].size and not (0 <= mine[2].min() <= mine[2].max() <= 1):
            raise InvalidValueError(
                f"PredictionWriter was told the model's rows are {self._kind} (scores=, or prediction_scores), but "
                f"they hold {float(mine[2].min()):.4g} ... {float(mine[2].max()):.4g}: say 'logits' (or "
                "'multi_label_logits') if predict_step returns logits."
            )
        parts = gathered_on_zero(trainer, mine)
        if parts is not None:
            self._write(trainer, _join(parts))

    def _write(self, trainer: Trainer, rows: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        index, classes, probs = rows
        order = np.argsort(index, kind="stable")
        index, classes, probs = index[order], classes[order], probs[order]
        each_input_once(index, "PredictionWriter")
        dm = getattr(trainer, "datamodule", None)
        # the training data's names, else those the model keeps in its checkpoint (ImageClassifier's class_names)
        names = list(getattr(dm, "classes", ()) or getattr(trainer.lightning_module, "class_names", None) or ())
        path_of = getattr(dm, "predict_path", None)
        k = classes.shape[1] if classes.ndim == 2 else 0
        header = ["path"] + [f"{what}_{j + 1}" for j in range(k) for what in ("class", "prob")]
        out = Path(self.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for i, cs, ps in zip(index.tolist(), classes.tolist(), probs.tolist()):
                row: list[Any] = [path_of(i) if path_of is not None else i]
                for c, p in zip(cs, ps):
                    row += [names[c] if c < len(names) else c, f"{p:.6f}"]
                writer.writerow(row)


def gathered_on_zero(trainer: Trainer, part: Any) -> list[Any] | None:
    """Every rank's ``part`` (picklable), in rank order, on rank zero; ``None`` on the other ranks."""
    parts = [part]
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        parts = [None] * trainer.world_size
        torch.distributed.all_gather_object(parts, part)
    return [p for p in parts if p is not None] if trainer.is_global_zero else None


def each_input_once(index: np.ndarray, writer: str) -> None:
    """Check that the sorted ``index`` names each input exactly once (``0 .. N - 1``).

    Raises:
        RuntimeError: Naming ``writer``, the repeated indices or that some are missing, and the likely cause.
    """
    if len(index) and not np.array_equal(index, np.arange(len(index))):
        repeated = index[1:][index[1:] == index[:-1]]
        raise RuntimeError(
            f"{writer} got each input's index not exactly once "
            f"({'repeated: ' + str(repeated[:5].tolist()) if repeated.size else 'some missing'}): a loader that "
            "pads its shards (torch's DistributedSampler) repeats inputs; use the DataModule's predict_dataloader."
        )


def _join(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One ``(indices, classes, probabilities)`` of many; a part without rows (a rank given no input) adds none."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return np.zeros(0, np.int64), np.zeros((0, 0), np.int64), np.zeros((0, 0), np.float32)
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
    )
