"""``MaskWriter``: ``trainer.predict``'s segmentation masks as PNG files, and one table of them, over all ranks."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from PIL import Image
from typing_extensions import override

from lightning_fastdata.callbacks.predictions import each_input_once, gathered_on_zero
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_path, atomic_write_bytes
from lightning_fastdata.segmentation.layouts import voc_palette

__all__ = ["MaskWriter", "mask_at_size"]


def mask_at_size(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``mask`` (``h x w``) resized to ``size`` (height, width) by nearest sampling at pixel centres.

    The inverse of the evaluation resize (:func:`~lightning_fastdata.sources.window.eval_window`): each pixel of
    the original image takes the class predicted at its own centre.
    """
    h, w = mask.shape
    rows = np.minimum(((np.arange(size[0]) + 0.5) * h / size[0]).astype(np.int64), h - 1)
    cols = np.minimum(((np.arange(size[1]) + 0.5) * w / size[1]).astype(np.int64), w - 1)
    return np.ascontiguousarray(mask[np.ix_(rows, cols)])


class MaskWriter(BasePredictionWriter):
    """Write each predicted mask as a PNG at its image's own size, and a table of them in input order.

    Works with :class:`~lightning_fastdata.SegmentationDataModule` given ``predict_root`` and a model whose
    ``predict_step`` returns ``N x H x W`` class indices (:class:`~lightning_fastdata.ImageSegmenter` does): each
    prediction is cut to its image's resized area (the batch pads the rest) and resized back to the image's size by
    nearest sampling, then written as ``output_dir/<the image's path under predict_root, .png>``: a palette PNG
    whose values are the classes (VOC's colours in a viewer), or a grey one with ``palette=False``. Every rank writes
    its own images' masks, each atomically (a temporary name, then a rename); rank zero then writes the table
    ``output_dir/<table>`` (columns ``path``, the input image, and ``mask``, the PNG relative to ``output_dir``),
    atomically, after checking every input came exactly once.

    Args:
        output_dir: The folder the masks and the table are written in (created).
        table: The table's file name in ``output_dir``.
        palette: Palette PNGs (VOC's colours) rather than grey ones; the values are the classes either way.

    Raises:
        ValueError: If ``table`` is not a plain file name; in ``trainer.predict``, if a prediction or batch is not
            what a segmentation prediction is (named).
    """

    def __init__(self, output_dir: str, table: str = "predictions.csv", palette: bool = True) -> None:
        super().__init__(write_interval="batch")
        if not table or os.path.basename(table) != table:
            raise InvalidValueError(f"table should be a file name (written in output_dir), got {table!r}.")
        self.output_dir, self.table, self.palette = os.fspath(output_dir), table, palette
        self._written: list[tuple[int, str]] = []

    @override
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._written = []
        Path(self.output_dir).mkdir(parents=True, exist_ok=True)

    def _name(self, trainer: Trainer, index: int) -> str:
        relpath = getattr(getattr(trainer, "datamodule", None), "predict_relpath", None)
        if relpath is None:
            return f"{index:08d}.png"
        rel = str(relpath(index)).replace("\\", "/").lstrip("/")
        parts = [p for p in rel.split("/") if p not in ("", ".", "..")]  # never above output_dir
        stem = "/".join(parts)
        dot = stem.rfind(".")
        return (stem[:dot] if dot > stem.rfind("/") else stem) + ".png"

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
        """Write the batch's masks, each cut to its image, at its image's size."""
        sizes = getattr(batch, "sizes", None)
        if not isinstance(prediction, torch.Tensor) or prediction.ndim != 3 or sizes is None:
            raise InvalidValueError(
                "MaskWriter needs predict_step to return N x H x W class indices (ImageSegmenter does) of batches "
                "that carry their images' sizes (SegmentationDataModule's predict batches), got "
                f"{type(prediction).__name__}{tuple(getattr(prediction, 'shape', ()))} of a {type(batch).__name__}."
            )
        masks = prediction.detach().to("cpu", torch.uint8).numpy()
        for k, (index, size) in enumerate(zip(batch.indices.tolist(), sizes.tolist())):
            height, width, placed_h, placed_w = size
            mask = mask_at_size(masks[k, :placed_h, :placed_w], (height, width))
            image = Image.fromarray(mask, mode="L")
            if self.palette:
                image = image.convert("P")
                image.putpalette(voc_palette())
            data = io.BytesIO()
            image.save(data, "PNG")
            name = self._name(trainer, int(index))
            out = Path(self.output_dir, name)
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(out, data.getvalue(), fsync=False)
            self._written.append((int(index), name))

    @override
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Gather every rank's written masks; rank zero writes the table."""
        super().on_predict_epoch_end(trainer, pl_module)
        parts = gathered_on_zero(trainer, self._written)
        self._written = []
        if parts is None:
            return
        rows = sorted(row for part in parts if part for row in part)
        each_input_once(np.array([i for i, _ in rows], dtype=np.int64), "MaskWriter")
        path_of = getattr(getattr(trainer, "datamodule", None), "predict_path", None)
        with atomic_path(Path(self.output_dir, self.table)) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "mask"])
            for index, name in rows:
                writer.writerow([path_of(index) if path_of is not None else index, name])
