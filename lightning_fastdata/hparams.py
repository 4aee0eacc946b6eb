"""``save_init_hparams``: Lightning's ``save_hyperparameters`` without the reference cycle it leaves behind."""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.core.mixins import HyperparametersMixin

__all__ = ["save_init_hparams", "without_secrets"]


def save_init_hparams(obj: HyperparametersMixin) -> None:
    """Call ``obj.save_hyperparameters()`` for the ``__init__`` that calls this, leaving no frame cycle.

    Lightning's ``save_hyperparameters`` keeps ``inspect.currentframe()`` in a local variable: its frame refers to
    itself, so it outlives the call and, through the caller's frame, keeps ``obj`` alive until the garbage
    collector runs. A DataModule freed that way took its loaders with it, and the collector finalises their
    worker queues first: each persistent worker then missed its shutdown message and was joined after a 5 s
    timeout. Handing over the caller's frame (and dropping our reference to it) frees ``obj`` by reference
    count, as any object.

    ``num_classes=None`` and ``class_names=None`` (read from the data) are left out (:data:`_FROM_THE_DATA`).

    A ``storage_options`` argument is saved without its secrets (:func:`without_secrets`), in ``hparams`` (what
    checkpoints keep) and in ``hparams_initial`` (what Lightning's loggers write to ``hparams.yaml`` and TensorBoard):
    checkpoints and logs are shared and copied; credentials come back from the environment.

    Any other value that is not plain data (a transform object given as ``train_transforms``, say) is saved as its
    ``repr``: a checkpoint holding a torchvision object would not load with ``torch.load(weights_only=True)``, what
    Lightning's resume uses. Pass such arguments again when building the object from a checkpoint's hparams.
    """
    frame = inspect.currentframe()
    try:
        caller = frame.f_back if frame is not None else None
        with warnings.catch_warnings():
            # Lightning's advice to ignore nn.Module arguments ("already saved during checkpointing") is for a
            # LightningModule's submodules; a transform object given to a DataModule is not, and is saved as text
            warnings.filterwarnings("ignore", message=r".*is an instance of `nn.Module` and is already saved")
            given = caller.f_locals if caller is not None else {}
            unread = [k for k in _FROM_THE_DATA if k in given and given[k] is None]
            obj.save_hyperparameters(ignore=unread, frame=caller)
        cleaned = {k: _plain(v) for k, v in obj.hparams.items()}
        options = cleaned.get("storage_options")
        if isinstance(options, dict) and without_secrets(options) != options:
            cleaned["storage_options"] = without_secrets(options)
        if any(cleaned[k] is not v for k, v in obj.hparams.items()):
            # saved again, from the cleaned values: Lightning keeps a deep copy as hparams_initial, which its
            # loggers write (hparams.yaml, TensorBoard) and which a change of obj.hparams would not reach
            obj.save_hyperparameters(cleaned, frame=caller)
    finally:
        del frame, caller


#: Arguments whose ``None`` means "read from the data" (the default): left out of the saved hyperparameters, where a
#: model's own ``num_classes``/``class_names`` (LightningCLI links the data's) would clash with ``None`` when Lightning
#: merges the two for its loggers ("Error while merging hparams").
_FROM_THE_DATA = ("num_classes", "class_names")


def _plain(value: Any) -> Any:
    """``value`` itself if it is plain data (numbers, strings, lists, tuples, dicts of them), else its ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        same = all(a is b for a, b in zip(items, value))
        return value if same else type(value)(items)
    if isinstance(value, dict):
        cleaned = {k: _plain(v) for k, v in value.items()}
        return value if all(cleaned[k] is v for k, v in value.items()) else cleaned
    return repr(value)


_SECRET = re.compile(r"secret|token|password|account_key|sas|credential", re.IGNORECASE)


def without_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_options`` without the keys that name a secret (secret, token, password, account key, SAS, credential).

    What every file we (or Lightning for us) write keeps of them: hyper-parameters, logger folders, saved configs.
    """
    return {k: v for k, v in options.items() if not _SECRET.search(str(k))}
