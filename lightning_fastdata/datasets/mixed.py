"""Several training sets as one: the samples of a :class:`~lightning_fastdata.MixedDataModule`'s sources.

Source ``s``'s sample ``i`` is the mix's sample ``offsets[s] + i``; the sampler draws over the mix's indices (the
sources' weights are per-sample weights, :mod:`~lightning_fastdata.loading.sampling`), so a mix is sharded, resumed
and continued on another world size as one dataset is. A batch is split by source, each source renders its part as
it would alone (its decode, crop, per-sample transforms), and the parts are joined one source after another, the
labels mapped into the mix's class list. A sample's key keeps the mix's index, and the source sees its own index
with the source's number folded into the key's ``repeat``: two sources' samples ``i`` draw different crops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fastdata.datasets.base import AugmentedImageDataset, LoaderPlan
from lightning_fastdata.loading.batch import DeviceBatch
from lightning_fastdata.loading.index.identity import DataIdentity, mix
from lightning_fastdata.loading.sampler import SampleKey

__all__ = ["MixedDataset"]


class MixedDataset(Dataset):
    """The training sets of several DataModules as one index space (module docstring).

    Args:
        sources: Each source's training dataset.
        label_maps: For each source, its class positions in the mix's class list (``int64``, one per source class).
        classes: The mix's class list.
        names: A name per source, for messages.
    """

    def __init__(
        self,
        sources: Sequence[AugmentedImageDataset],
        label_maps: Sequence[np.ndarray],
        classes: Sequence[str],
        names: Sequence[str],
    ) -> None:
        self.sources = list(sources)
        self.label_maps = [np.asarray(m, dtype=np.int64) for m in label_maps]
        self.classes = tuple(classes)
        self.names = tuple(names)
        self.offsets = np.cumsum([0] + [len(s) for s in self.sources]).astype(np.int64)
        self._targets = np.concatenate([m[np.asarray(s.targets)] for s, m in zip(self.sources, self.label_maps)])
        self.plan = LoaderPlan()
        self._identity: DataIdentity | None = None

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label in the mix's class list, one source after another."""
        return self._targets

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def for_loader(self, plan: LoaderPlan) -> MixedDataset:
        """This mix as one loader reads it: the sources read with ``plan`` (less its label map, applied here)."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        source_plan = LoaderPlan(return_keys=plan.return_keys, epoch_samples=plan.epoch_samples)
        twin.sources = [s.for_loader(source_plan) for s in self.sources]
        twin.plan = plan
        return twin

    @property
    def reads_ahead(self) -> bool:
        """A mix reads no batch ahead (its next batch's sources are the sampler's to say)."""
        return False

    def source_of(self, index: int) -> tuple[int, int]:
        """``(source, its own index)`` of the mix's sample ``index``."""
        s = int(np.searchsorted(self.offsets, index, side="right")) - 1
        if not 0 <= s < len(self.sources) or index >= len(self):
            raise IndexError(f"index {index} is out of range for a mix of {len(self)} samples.")
        return s, index - int(self.offsets[s])

    def describe(self, index: int) -> str:
        """The sample as its source names it, with the source's name."""
        s, local = self.source_of(index)
        return f"{self.sources[s].describe(local)} (source {self.names[s]!r})"

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> tuple[torch.Tensor, torch.Tensor] | DeviceBatch:
        """A batch: each source's part rendered by that source, joined in source order, labels in the mix's list."""
        full = [
            (0, int(k), 0)
            if not isinstance(k, (tuple, list))
            else (int(k[0]), int(k[1]), int(k[2]) if len(k) > 2 else 0)
            for k in keys
        ]
        index = np.fromiter((k[1] for k in full), dtype=np.int64, count=len(full))
        source = np.searchsorted(self.offsets, index, side="right") - 1
        count = len(self.sources)
        images, labels, device_keys = [], [], []
        for s in np.unique(source).tolist():
            rows = np.flatnonzero(source == s)
            local = [(full[r][0], full[r][1] - int(self.offsets[s]), full[r][2] * count + s) for r in rows]
            part = self.sources[s].__getitems__(local)
            part_images, part_labels = part[0], part[1]
            images.append(part_images)
            labels.append(torch.from_numpy(self.label_maps[s][part_labels.numpy()]))
            if isinstance(part, DeviceBatch) and part.keys is not None:
                moved = part.keys.clone()
                moved[:, 1] += int(self.offsets[s])  # the device draws from the mix's index
                device_keys.append(moved)
        batch_images = torch.cat(images).contiguous(memory_format=torch.channels_last)
        batch_labels = torch.cat(labels)
        if self.plan.label_map is not None:
            batch_labels = torch.from_numpy(self.plan.label_map[batch_labels.numpy()])
        if device_keys:
            return DeviceBatch(batch_images, batch_labels, torch.cat(device_keys))
        return batch_images, batch_labels

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([key])[:2]
        return images[0], int(labels[0])

    def identity(self) -> DataIdentity:
        """Every source's identity, each sample's hash tagged with its source's number, and the class lists."""
        if self._identity is None:
            parts = [
                s.identity().samples ^ mix(np.full(len(s), k, dtype=np.uint64)) for k, s in enumerate(self.sources)
            ]
            extra = "mix|" + "|".join(s.identity().digest for s in self.sources) + "|" + "/".join(self.classes)
            self._identity = DataIdentity.of("mix", np.concatenate(parts), extra)
        return self._identity

    def skipped_count(self, epoch: int | None = None) -> int:
        """Corrupt images skipped by every source (``on_corrupt='skip'``)."""
        return sum(s.skipped_count(epoch) for s in self.sources)

    def reset_skipped_count(self, epoch: int) -> None:
        """Reset every source's count of ``epoch``."""
        for s in self.sources:
            s.reset_skipped_count(epoch)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)
