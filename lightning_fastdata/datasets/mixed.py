"""Several training sets as one: the samples of a :class:`~lightning_fastdata.MixedDataModule`'s sources.

Source ``s``'s sample ``i`` is the mix's sample ``offsets[s] + i``; the sampler draws over the mix's indices (the
sources' weights are per-sample weights, :mod:`~lightning_fastdata.loading.sampling`), so a mix is sharded, resumed
and continued on another world size as one dataset is. A batch is grouped by source, and each source renders its
samples as it would alone (its decode, crop, per-sample transforms) into its slice of one shared batch (no copy),
one source after another, the labels mapped into the mix's class list. A sample's key keeps the mix's index, and
the source sees its own index with the source's number folded into the key's ``repeat``: two sources' samples
``i`` draw different crops.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fastdata.datasets.base import AugmentedImageDataset, LoaderPlan
from lightning_fastdata.loading.batch import Batch, DeviceBatch, EncodedBatch
from lightning_fastdata.loading.index.identity import DataIdentity, mix
from lightning_fastdata.loading.sampler import SampleKey
from lightning_fastdata.loading.sampling import map_labels
from lightning_fastdata.loading.transport.collate import EncodedRows, empty_image_batch

__all__ = ["MixedDataset"]


def _full_key(key: int | SampleKey) -> tuple[int, int, int]:
    if isinstance(key, (tuple, list)):
        return int(key[0]), int(key[1]), int(key[2]) if len(key) > 2 else 0
    return 0, int(key), 0


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
        source_plan = LoaderPlan(
            return_keys=plan.return_keys, epoch_samples=plan.epoch_samples, decode_on_device=plan.decode_on_device
        )
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
        """A batch in one shared tensor: each source renders its samples into its slice, in source order.

        With the device decode (``decode_on="device"``), an ``EncodedBatch`` of every source's rows, in source order.
        """
        if self.plan.decode_on_device:
            return self._encoded(keys)  # type: ignore[return-value]
        size = self.sources[0].image_size
        images = empty_image_batch(len(keys), size, size)
        labels = torch.empty(len(keys), dtype=torch.int64)
        kept = np.ones(len(keys), dtype=bool)
        keys_out = torch.empty((len(keys), 3), dtype=torch.int64)
        start = 0
        for s, local in self._by_source(keys):  # the batch's rows grouped by source: a slice each
            stop = start + len(local)
            _, part_labels, part_keys, part_kept = self.sources[s].render(local, images[start:stop])
            labels[start:stop] = torch.from_numpy(map_labels(part_labels.numpy(), self.label_maps[s]))
            kept[start:stop] = part_kept
            keys_out[start:stop] = torch.tensor([(k[0], k[1] + int(self.offsets[s]), k[2]) for k in part_keys])
            start = stop
        labels = torch.from_numpy(map_labels(labels.numpy(), self.plan.label_map))
        if not kept.all():  # a source skipped a corrupt image (on_corrupt="skip")
            mask = torch.from_numpy(kept)
            images, labels, keys_out = (
                images[mask].contiguous(memory_format=torch.channels_last),
                labels[mask],
                keys_out[mask],
            )
        if self.plan.return_keys:  # the device draws from the mix's index
            return DeviceBatch(images, labels, keys_out)
        return Batch(images, labels)

    def _by_source(self, keys: Sequence[int | SampleKey]) -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
        """Each source in ``keys``, in source order, with its samples' keys in its own terms.

        A key keeps its epoch; its index becomes the source's own, its repeat is tagged with the source's number (so
        two sources' samples of one index draw apart).
        """
        full = [_full_key(k) for k in keys]
        index = np.fromiter((k[1] for k in full), dtype=np.int64, count=len(full))
        source = np.searchsorted(self.offsets, index, side="right") - 1
        order = np.argsort(source, kind="stable")
        count = len(self.sources)
        for s in np.unique(source).tolist():
            base = int(self.offsets[s])
            yield s, [(full[r][0], full[r][1] - base, full[r][2] * count + s) for r in order[source[order] == s]]

    def _encoded(self, keys: Sequence[int | SampleKey]) -> EncodedBatch:
        """Each source's rows planned for the device decode, in source order, labels and keys in the mix's terms."""
        parts = []
        for s, local in self._by_source(keys):
            base = int(self.offsets[s])
            part = self.sources[s].encode(local)
            part.labels = torch.from_numpy(map_labels(part.labels.numpy(), self.label_maps[s]))
            part.indices = part.indices + base
            part.full_keys = [(k[0], k[1] + base, k[2]) for k in part.full_keys]
            parts.append(part)
        rows = EncodedRows.join(parts)
        rows.labels = torch.from_numpy(map_labels(rows.labels.numpy(), self.plan.label_map))
        return rows.pack(self.plan.return_keys, predicting=False)

    def skip_sample(self, key: int | SampleKey, index: int, err: BaseException) -> None:
        """A corrupt sample (found on the device), raised or skipped and counted by its source."""
        s, local = self.source_of(index)
        full = _full_key(key)
        self.sources[s].skip_sample((full[0], local, full[2]), local, err)

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
