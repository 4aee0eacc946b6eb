"""``EmbeddingWriter``: ``trainer.predict``'s embeddings as one array, a row per input in input order, all ranks."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from lightning_fastdata.callbacks.predictions import each_input_once, gathered_on_zero
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_path

__all__ = ["EmbeddingWriter"]


class EmbeddingWriter(BasePredictionWriter):
    """Write each input's embedding to ``OUTPUT/embeddings.npy`` and its path to ``OUTPUT/paths.csv``, in input order.

    For retrieval and zero-shot labelling with a model whose ``predict_step`` returns ``{"indices": ...,
    "embeddings": ...}`` (``ContrastiveModel`` on a DataModule given ``predict_root``) or an ``N x D`` tensor for a
    ``(images, indices)`` batch. Row ``i`` of the array is input ``i`` (``datamodule.predict_path(i)``, row ``i`` of
    the table). Each batch's rows are copied to the host without waiting for the device (one wait at the end of the
    epoch); every rank's rows are then gathered on rank zero (``all_gather_object``: the whole array passes through
    rank zero's memory), checked (each input exactly once), and written atomically (a temporary name, then a rename).

    Args:
        output: The folder to write into (created); its two files are replaced by each ``trainer.predict``.
        key: The prediction's entry holding the embeddings, where ``predict_step`` returns a dict.
        dtype: The array's type (``"float16"`` halves its size).

    Raises:
        ValueError: On a bad ``dtype``; while predicting, if ``predict_step`` returns no ``N x D`` embeddings.
    """

    def __init__(self, output: str, key: str = "embeddings", dtype: Literal["float32", "float16"] = "float32") -> None:
        super().__init__(write_interval="batch")
        if dtype not in ("float32", "float16"):
            raise InvalidValueError(f"dtype should be 'float32' or 'float16', got {dtype!r}.")
        self.output, self.key, self.dtype = os.fspath(output), key, dtype
        self._rows: list[tuple[torch.Tensor, torch.Tensor]] = []

    @override
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._rows = []

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
        """Keep the batch's embeddings, by input index."""
        indices = None
        if isinstance(prediction, dict):
            indices, prediction = prediction.get("indices"), prediction.get(self.key)
        if not isinstance(prediction, torch.Tensor) or prediction.ndim != 2:
            shape = tuple(prediction.shape) if hasattr(prediction, "shape") else ""
            raise InvalidValueError(
                f"EmbeddingWriter needs predict_step to return an N x D tensor (or a dict with {self.key!r}), got "
                f"{type(prediction).__name__}{shape}."
            )
        if indices is None:
            indices = getattr(batch, "indices", None)
            indices = batch[1] if indices is None else indices  # a PredictBatch names it; a plain tuple's second
        embeddings = prediction.detach().to(getattr(torch, self.dtype))
        # to the host without a wait for the device (in stream order); read once, at the epoch's end
        self._rows.append((indices.to("cpu", non_blocking=True, copy=True), embeddings.to("cpu", non_blocking=True)))

    @override
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Gather every rank's rows and write the two files on rank zero."""
        super().on_predict_epoch_end(trainer, pl_module)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the one wait: every batch's copies to the host are done after it
        rows = [(i.numpy().astype(np.int64), e.numpy()) for i, e in self._rows]
        self._rows = []
        mine = (
            np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int64),
            np.concatenate([r[1] for r in rows]) if rows else np.zeros((0, 0), self.dtype),
        )
        parts = gathered_on_zero(trainer, mine)
        if parts is None:
            return
        parts = [p for p in parts if len(p[0])]
        index = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        order = np.argsort(index, kind="stable")
        each_input_once(index[order], "EmbeddingWriter")
        embeddings = np.concatenate([p[1] for p in parts])[order] if parts else np.zeros((0, 0), self.dtype)
        self._write(trainer, index[order], embeddings)

    def _write(self, trainer: Trainer, index: np.ndarray, embeddings: np.ndarray) -> None:
        out = Path(self.output)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_path(out / "embeddings.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(embeddings))
        path_of = getattr(getattr(trainer, "datamodule", None), "predict_path", None)
        with atomic_path(out / "paths.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["row", "path"])
            for row, i in enumerate(index.tolist()):
                writer.writerow([row, path_of(i) if path_of is not None else i])
