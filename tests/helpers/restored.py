"""A training loader stopped after its epoch's first batch, and a fresh DataModule's loader restored from there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def rest_and_restored(loader: Any, make: Callable[[], Any]) -> tuple[list[Any], list[Any]]:
    """``loader``'s batches after its first, and the batches of ``make()``'s train loader restored from its state then.

    An exact resume gives the same batches, in the same order (the callers compare them, each in its batch's terms).
    """
    it = iter(loader)
    next(it)
    state, rest = loader.state_dict(), list(it)
    again = make()
    again.setup("fit")
    resumed = again.train_dataloader()
    resumed.load_state_dict(state)
    return rest, list(resumed)
