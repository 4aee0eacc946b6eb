"""``save_init_hparams``: Lightning's ``save_hyperparameters`` without the reference cycle it leaves behind."""

from __future__ import annotations

import inspect
import re

from lightning.pytorch.core.mixins import HyperparametersMixin

__all__ = ["save_init_hparams"]


def save_init_hparams(obj: HyperparametersMixin) -> None:
    """Call ``obj.save_hyperparameters()`` for the ``__init__`` that calls this, leaving no frame cycle.

    Lightning's ``save_hyperparameters`` keeps ``inspect.currentframe()`` in a local variable: its frame refers to
    itself, so it outlives the call and, through the caller's frame, keeps ``obj`` alive until the garbage
    collector runs. A DataModule freed that way took its loaders with it, and the collector finalises their
    worker queues first: each persistent worker then missed its shutdown message and was joined after a 5 s
    timeout. Handing over the caller's frame (and dropping our reference to it) frees ``obj`` by reference
    count, as any object.

    A ``storage_options`` argument is saved without its secrets (keys naming a secret, token, password or
    account key): checkpoints are shared and copied, credentials come back from the environment.
    """
    frame = inspect.currentframe()
    try:
        obj.save_hyperparameters(frame=frame.f_back if frame is not None else None)
    finally:
        del frame
    options = obj.hparams.get("storage_options")
    if isinstance(options, dict):
        obj.hparams["storage_options"] = {k: v for k, v in options.items() if not _SECRET.search(k)}


_SECRET = re.compile(r"secret|token|password|account_key|sas|credential", re.IGNORECASE)
