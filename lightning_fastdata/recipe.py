"""A training recipe, read from a config, and the loader torchvision's reference builds for it; the shipped configs.

What ``fastdata bench --suites recipe``, ``fastdata doctor --recipe`` and the GPU check's ``recipe`` part share
(so the tool tier's parts import it, not each other): :func:`load_recipe` turns a LightningCLI config's data
arguments (``train_transforms``, ``device_transforms``, ``batch_transforms``, ...) into objects;
:func:`reference_loader` is the same recipe as torchvision's ``references/classification`` runs it (the baseline
of every recipe row); :func:`find_config` finds a config by path or shipped name.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate
from torchvision import datasets
from torchvision.transforms import v2

from lightning_fastdata.augment.batched import KeyedTransform
from lightning_fastdata.augment.pipeline import as_transform_list
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.errors import InvalidValueError, UsageError
from lightning_fastdata.shipped import CONFIG_DIR, ConfigNotFoundError, find_config, shipped_configs

__all__ = [
    "CONFIG_DIR",
    "RECIPE_ARGS",
    "ConfigNotFoundError",
    "find_config",
    "load_recipe",
    "per_image",
    "reference_loader",
    "shipped_configs",
]

#: The DataModule arguments that make a recipe (what ``--recipe CONFIG`` takes from the config's ``data``).
RECIPE_ARGS = (
    "train_transforms",
    "device_transforms",
    "batch_transforms",
    "scale",
    "ratio",
    "repeated_augmentations",
)


def load_recipe(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recipe arguments of a LightningCLI config: ``(instantiated, as written in the YAML)``.

    ``path`` is a file or the name of a shipped config (``recipe_torchvision``). The config's ``image_size`` is in
    both too (the crop the recipe trains at).

    Raises:
        UsageError: If the config cannot be read or its data arguments do not parse (naming the file).
    """
    import yaml
    from jsonargparse import ArgumentParser

    config = find_config(path)
    try:
        init = ((yaml.safe_load(Path(config).read_text()) or {}).get("data") or {}).get("init_args") or {}
        raw = {k: init[k] for k in (*RECIPE_ARGS, "image_size") if k in init}
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(FastDataModule, "data", instantiate=False)
        # parse_object resolves class paths in what it is given: a copy, so `raw` stays as written
        made = vars(parser.instantiate(parser.parse_object({"data": copy.deepcopy(raw)})).data)
    except Exception as err:  # noqa: BLE001 - jsonargparse and yaml raise many kinds; the message names them
        raise UsageError(f"Could not read the recipe in {config}: {err}") from err
    return {k: made[k] for k in raw}, raw


def per_image(transforms: list[Any]) -> list[Any]:
    """Each of ``transforms`` as torchvision's per-image transform (our batched policies' twins; others as they are)."""
    return [t.to_torchvision() if isinstance(t, KeyedTransform) else t for t in transforms]


def device_tensors(obj: Any, limit: int = 100_000) -> list[str]:
    """The tensors on a device (not the CPU) reachable from ``obj``, each as ``"<type> <shape> on <device>"``.

    What a loader's worker-side objects (its dataset, transforms, collate function) must not hold: a forked worker
    that touches a CUDA tensor (uses it, or frees it when its garbage is collected) dies with ``CUDA error:
    initialization error``. Follows ``gc.get_referents`` breadth-first (a function: its closure and defaults, not
    its module's globals), modules and classes excluded, over at most ``limit`` objects.
    """
    import gc
    from collections import deque

    found: list[str] = []
    seen: set[int] = set()
    queue = deque([obj])
    while queue and len(seen) < limit:
        item = queue.popleft()
        kind = type(item)
        if id(item) in seen or issubclass(kind, (types.ModuleType, type, str, bytes, int, float)):
            continue
        seen.add(id(item))
        if issubclass(kind, torch.Tensor):
            if item.device.type != "cpu":
                found.append(f"{kind.__name__} {tuple(item.shape)} on {item.device}")
        elif issubclass(kind, types.FunctionType):
            cells = [c.cell_contents for c in item.__closure__ or () if c.cell_contents is not None]
            queue.extend([*cells, item.__defaults__ or (), item.__kwdefaults__ or {}])
        else:
            queue.extend(gc.get_referents(item))
    return found


def reference_loader(
    root: str, recipe: dict[str, Any], batch_size: int, workers: int, pin_memory: bool = False
) -> DataLoader:
    """The recipe as torchvision's reference builds it: per-image transforms in the workers, mixing in collate.

    ``pin_memory=True`` as the reference's ``train.py`` passes it when it trains on a GPU.
    """
    size = int(recipe.get("image_size", 224))
    device = as_transform_list(recipe.get("device_transforms"), "device_transforms")
    after = as_transform_list(recipe.get("batch_transforms"), "batch_transforms")
    bilinear = v2.InterpolationMode.BILINEAR
    preset = v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=recipe.get("scale", (0.08, 1.0)), interpolation=bilinear, antialias=True),
            v2.RandomHorizontalFlip(0.5),
            *per_image(device),
            v2.PILToTensor(),
            *as_transform_list(recipe.get("train_transforms"), "train_transforms"),
            v2.ToDtype(torch.float, scale=True),
            v2.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
            *[t.to_torchvision() for t in after if isinstance(t, KeyedTransform)],
            v2.ToPureTensor(),
        ]
    )
    ds = datasets.ImageFolder(root, transform=preset)
    mixing = [t for t in after if not isinstance(t, KeyedTransform)]
    num_classes = len(ds.classes)

    def collate(batch: Any) -> Any:
        images, labels = default_collate(batch)
        for t in mixing:
            if labels.dim() == 1:
                labels = torch.nn.functional.one_hot(labels, num_classes).float()
            images, labels = t(images, labels)
        return images, labels

    held = device_tensors((preset, mixing))
    if held:
        raise InvalidValueError(
            f"The recipe's transforms hold tensors on a device ({', '.join(held[:3])}): the reference loader's "
            "workers run them, and a forked worker that touches device memory dies (CUDA error: initialization "
            "error). Give the recipe transforms that keep their state on the CPU."
        )
    return DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=collate,
        pin_memory=pin_memory,
    )
