"""``BoxWriter``: ``trainer.predict``'s detections as a COCO results file and a table, over all ranks."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from lightning_fastdata.callbacks.predictions import each_input_once, gathered_on_zero
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_path

__all__ = ["BoxWriter"]

#: One image's detections as kept until the epoch's end: its input index, ``boxes`` (``n x 4`` XYXY), labels, scores.
_Kept = tuple[int, np.ndarray, np.ndarray, np.ndarray]


class BoxWriter(BasePredictionWriter):
    """Write every image's detections as COCO's results file and one table, in input order.

    Works with :class:`~lightning_fastdata.DetectionDataModule` given ``predict_root`` and a model whose
    ``predict_step`` returns, per image, a dict of ``boxes`` (XYXY in the image's own pixels), ``labels`` (the data's
    classes) and ``scores`` (:class:`~lightning_fastdata.ObjectDetector` does). Each rank keeps its images'
    detections; at the epoch's end rank zero gathers them, checks every input came exactly once and writes, each
    atomically:

    - ``output_dir/<results>``: COCO's results format (``[{"image_id", "category_id", "bbox": [x, y, width, height],
      "score"}, ...]``), in the original category ids (``datamodule.category_of``: COCO's sparse ids, VOC's names,
      YOLO's indices) and the image's pixels; ``image_id`` COCO's id where the input is one of the COCO data's images
      (``datamodule.predict_image_id``), else its name under ``predict_root``: ``pycocotools``' ``loadRes`` reads it;
    - ``output_dir/<table>``: a CSV row per box (``path, xmin, ymin, xmax, ymax, label, category, score``, ``label``
      the class's name), an image without a detection a row with empty box fields.

    Args:
        output_dir: The folder the files are written in (created).
        results: The COCO results file's name in ``output_dir``.
        table: The CSV file's name in ``output_dir``.
        min_score: Detections scored below this are left out.

    Raises:
        ValueError: If a file name is not a plain file name; in ``trainer.predict``, if a prediction or batch is not
            what a detection prediction is (named).
    """

    def __init__(
        self,
        output_dir: str,
        results: str = "detections.json",
        table: str = "detections.csv",
        min_score: float = 0.0,
    ) -> None:
        super().__init__(write_interval="batch")
        for name in (results, table):
            if not name or os.path.basename(name) != name:
                raise InvalidValueError(
                    f"results and table should be file names (written in output_dir), got {name!r}."
                )
        self.output_dir, self.results, self.table, self.min_score = os.fspath(output_dir), results, table, min_score
        self._kept: list[_Kept] = []

    @override
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._kept = []
        Path(self.output_dir).mkdir(parents=True, exist_ok=True)

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
        """Keep the batch's detections (on the host) until the epoch's end."""
        indices = getattr(batch, "indices", None)
        if (
            not isinstance(prediction, (list, tuple))
            or indices is None
            or len(prediction) != len(indices)
            or not all(isinstance(d, dict) and {"boxes", "labels", "scores"} <= set(d) for d in prediction)
        ):
            raise InvalidValueError(
                "BoxWriter needs predict_step to return a list of {'boxes', 'labels', 'scores'} dicts, one per image "
                "(ObjectDetector does), of batches that carry their images' indices (DetectionDataModule's predict "
                f"batches); got {type(prediction).__name__} for a {type(batch).__name__}."
            )
        for index, d in zip(indices.tolist(), prediction):
            keep = d["scores"].detach().cpu() >= self.min_score
            self._kept.append((int(index), *(d[k].detach().cpu()[keep].numpy() for k in ("boxes", "labels", "scores"))))

    @override
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Gather every rank's detections; rank zero writes the results file and the table."""
        super().on_predict_epoch_end(trainer, pl_module)
        parts = gathered_on_zero(trainer, self._kept)
        self._kept = []
        if parts is None:
            return
        kept = sorted((row for part in parts if part for row in part), key=lambda row: row[0])
        each_input_once(np.array([row[0] for row in kept], dtype=np.int64), "BoxWriter")
        self._write(getattr(trainer, "datamodule", None), kept)

    def _write(self, dm: Any, kept: list[_Kept]) -> None:
        """The results file and the table of ``kept`` (module docstring)."""
        image_id = getattr(dm, "predict_image_id", lambda i: i)
        path_of = getattr(dm, "predict_path", lambda i: i)
        category_of = getattr(dm, "category_of", lambda label: label)
        names = getattr(dm, "classes", None)
        results: list[dict[str, Any]] = []
        with atomic_path(Path(self.output_dir, self.table)) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "xmin", "ymin", "xmax", "ymax", "label", "category", "score"])
            for index, boxes, labels, scores in kept:
                path, ident = path_of(index), image_id(index)
                if not len(boxes):
                    writer.writerow([path, "", "", "", "", "", "", ""])
                for box, label, score in zip(boxes.tolist(), labels.tolist(), scores.tolist()):
                    category = category_of(int(label))
                    name = names[int(label)] if names is not None else int(label)
                    writer.writerow([path, *(round(v, 2) for v in box), name, category, round(score, 5)])
                    x1, y1, x2, y2 = box
                    xywh = [round(v, 2) for v in (x1, y1, x2 - x1, y2 - y1)]
                    results.append({"image_id": ident, "category_id": category, "bbox": xywh, "score": round(score, 5)})
        with atomic_path(Path(self.output_dir, self.results)) as tmp:
            Path(tmp).write_text(json.dumps(results), encoding="utf-8")
