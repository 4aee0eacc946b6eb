"""A callback for CLI tests: appends each training step's epoch, step and labels to $FASTDATA_RECORD (JSON lines)."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl


class StepRecorder(pl.Callback):
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        line = {"epoch": trainer.current_epoch, "step": trainer.global_step, "batch_idx": idx}
        line["labels"] = batch[1].tolist()
        with open(os.environ["FASTDATA_RECORD"], "a") as f:
            f.write(json.dumps(line) + "\n")
