"""Helpers for tests and benchmarks: a quiet CPU Trainer (fake image folders are in ``lightning_fastdata.demos``)."""

from __future__ import annotations

from typing import Any

__all__ = ["cpu_trainer"]


def cpu_trainer(*callbacks: Any, epochs: int = 1, **kwargs: Any) -> Any:
    """A quiet CPU ``lightning.Trainer`` for tests and benchmarks: no logger, checkpoints, progress bar or summary.

    ``kwargs`` override or extend the options (e.g. ``max_steps``; pass ``epochs=-1`` to bound by steps only).
    """
    import lightning.pytorch as pl

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
