"""The DataModules' loader arguments: checked once, and read as attributes of the parts that own them."""

from __future__ import annotations

import inspect
from typing import Any, Literal

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.workers import resolve_num_workers

__all__ = [
    "base_arguments",
    "check_decode_on",
    "check_loader_arguments",
    "entropy_index_setting",
    "refuse_old_names",
    "setting",
]


def check_loader_arguments(
    val_fraction: float,
    batch_size: int,
    num_workers: int | Literal["auto"],
    prefetch_factor: int | None,
    persistent_workers: bool | None,
    block_shuffle: int | None,
    snapshot_every_n_steps: int | None,
    repeated_augmentations: int,
) -> None:
    """Raise on an impossible value or combination of :class:`~lightning_fastdata.FastDataModule`'s loader arguments.

    Raises:
        ValueError: Naming the argument and what it takes.
    """
    if not 0 <= val_fraction < 1:
        raise InvalidValueError(f"val_fraction should be in [0, 1), got {val_fraction!r}.")
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise InvalidValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}.")
    resolve_num_workers(num_workers)  # validates; resolved again once the Trainer's device count is known
    if num_workers == 0 and prefetch_factor is not None:
        raise InvalidValueError(
            f"prefetch_factor={prefetch_factor!r} needs worker processes; use num_workers > 0 or leave "
            "prefetch_factor unset."
        )
    if num_workers == 0 and persistent_workers:
        raise InvalidValueError("persistent_workers=True needs worker processes; use num_workers > 0.")
    if prefetch_factor is not None and prefetch_factor < 1:
        raise InvalidValueError(f"prefetch_factor should be a positive int, got {prefetch_factor!r}.")
    if block_shuffle is not None and block_shuffle < 1:
        raise InvalidValueError(f"block_shuffle should be a positive int or None, got {block_shuffle!r}.")
    if snapshot_every_n_steps is not None and snapshot_every_n_steps < 1:
        raise InvalidValueError(f"snapshot_every_n_steps should be a positive int, got {snapshot_every_n_steps!r}.")
    if not isinstance(repeated_augmentations, int) or repeated_augmentations < 1:
        raise InvalidValueError(
            f"repeated_augmentations should be a positive int (1: off), got {repeated_augmentations!r}."
        )


def check_decode_on(
    decode_on: str, train_transforms: Any = None, val_transforms: Any = None, module: Any = None
) -> None:
    """Raise for a ``decode_on`` the DataModule cannot do: unknown, with per-sample transforms, or on decoded pixels.

    ``module``: the DataModule, once it knows it reads decoded pixels (``decodes_images()`` is ``False``).

    Raises:
        ValueError: Naming the argument and what to do instead.
    """
    if decode_on not in ("workers", "device"):
        raise InvalidValueError(f"decode_on should be 'workers' or 'device', got {decode_on!r}.")
    if decode_on != "device":
        return
    given = [name for name, t in (("train_transforms", train_transforms), ("val_transforms", val_transforms)) if t]
    if given:
        raise InvalidValueError(
            f"decode_on='device' crops on the training device, after the loader workers, so {' and '.join(given)} "
            "(run in the workers on each crop) cannot run: pass the policy as device_transforms (TrivialAugmentWide, "
            "RandAugment, ...), or keep decode_on='workers'."
        )
    if module is not None:
        raise InvalidValueError(
            f"decode_on='device' decodes JPEG bytes on the GPU, and this {type(module).__name__} reads decoded pixels "
            "(nothing to decode): leave decode_on='workers'."
        )


def entropy_index_setting(entropy_index: bool | Literal["auto"]) -> bool | str:
    """A DataModule's ``entropy_index`` argument, checked.

    ``True``, ``"auto"``, or ``False`` (also where this install has no compiled JPEG decoder and ``"auto"`` was asked).

    Raises:
        ValueError: For another value, or ``True`` without the compiled decoder (saying what to install).
    """
    from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available

    if entropy_index not in (True, False, "auto"):
        raise InvalidValueError(f"entropy_index should be True, False or 'auto', got {entropy_index!r}.")
    if entropy_index is True and not entropy_index_available():
        raise InvalidValueError(
            "entropy_index=True needs the compiled JPEG decoder, which this install lacks (it was built without "
            "libjpeg-turbo's headers): install libjpeg62-turbo-dev or libjpeg-turbo8-dev and reinstall."
        )
    return entropy_index if entropy_index_available() else False


def setting(part: str, name: str) -> Any:
    """An attribute of the DataModule that is ``name`` of the part it owns (``loading`` or ``transfer``)."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, part), name)

    def set_(self: Any, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, set_, doc=f"``{name}``: see the class's arguments.")


#: The names arguments had before one vocabulary (every module's data is ``root``/``val_root``/``test_root``/
#: ``predict_root``, its class names ``class_names``), and theirs now.
OLD_NAMES = {
    "path": "root", "val_path": "val_root", "test_path": "test_root",
    "shards": "root", "val_shards": "val_root", "test_shards": "test_root", "predict_shards": "predict_root",
    "label_classes": "class_names",
}  # fmt: skip


def refuse_old_names(module: str, kwargs: dict[str, Any]) -> None:
    """Raise for an argument given by the name it had before the modules shared one vocabulary (its new name said).

    Raises:
        TypeError: Naming the old and the new name.
    """
    old = [name for name in kwargs if name in OLD_NAMES]
    if old:
        renames = ", ".join(f"{name}= is {OLD_NAMES[name]}=" for name in old)
        raise TypeError(
            f"{module}: {renames} now (one name for the same thing on every module: the data is root, val_root, "
            "test_root and predict_root; the class list class_names). Rename the argument."
        )


def base_arguments(base: type, given: dict[str, Any], **fixed: Any) -> dict[str, Any]:
    """The arguments of ``base.__init__`` among a subclass's own ``given`` (its ``locals()``), with ``fixed`` set.

    For a DataModule that names each argument it takes (no ``**kwargs``: LightningCLI and ``help()`` show only what
    works) and hands the base's on.
    """
    names = inspect.signature(base).parameters
    return {**{k: v for k, v in given.items() if k in names and k != "self"}, **fixed}
