"""Shared test helpers."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def cpu_trainer(*callbacks: pl.Callback, epochs: int = 1, **kwargs: Any) -> pl.Trainer:
    """A quiet CPU Trainer for tests: no logger, no checkpoints, no progress bar, no model summary."""
    options: dict[str, Any] = dict(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    options.update(kwargs)
    return pl.Trainer(**options)
