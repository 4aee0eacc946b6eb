"""``Spy``: a callback that keeps every training batch as the step received it (after transfer, on its device)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


class Spy(pl.Callback):
    def __init__(self) -> None:
        self.batches: list[Any] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        self.batches.append(batch)
