"""``TarShardDataset``: the samples of WebDataset tar shards, read by random access and decoded as files are.

Each sample's image is read with one ``pread`` at the offset its shard's index gives
(:mod:`~lightning_fastdata.loading.index.tar_index`) and then goes through the same path as a file of an image
folder: the decode of the crop only, the batch built in shared memory, corrupt images by ``on_corrupt``. Samples are
numbered shard after shard, in member order, so a sampler's epoch is a global shuffle of all of them. Each process
opens the shards itself (after a ``fork`` too) and checks, when it opens one, that it is the shard that was indexed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix, string_hash
from lightning_fastdata.loading.index.tar_index import TarIndex

__all__ = ["TarShardDataset"]


class TarShardDataset(AugmentedImageDataset):
    """The samples of tar shards (in the order given, each in member order), as whole uint8 batches.

    Args:
        shards: Each shard's :class:`~lightning_fastdata.loading.index.tar_index.TarIndex`.
        classes: The class names, in label order (a label ``k`` is ``classes[k]``).
        indices: The samples (numbered shard after shard) this dataset holds, in order; ``None``: all (a split).
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`.

    Raises:
        ValueError: If there is no sample, or a label is outside ``classes`` (naming the shard and sample).
    """

    per_process_attrs = ("_fds",)

    def __init__(
        self, shards: Sequence[TarIndex], classes: Sequence[str], indices: np.ndarray | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.shards = list(shards)
        self._classes = tuple(str(c) for c in classes)
        counts = [len(s) for s in self.shards]
        if not sum(counts):
            raise InvalidValueError(f"The shards {[s.path for s in self.shards][:3]} hold no sample.")
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows = np.arange(self._starts[-1]) if indices is None else np.asarray(indices, dtype=np.int64)
        self._rows = rows  # each sample's number among all the shards' samples
        self._shard_of = np.repeat(np.arange(len(self.shards), dtype=np.int32), counts)[rows]
        self._offsets = np.concatenate([s.offsets for s in self.shards])[rows]
        self._sizes = np.concatenate([s.sizes for s in self.shards])[rows]
        self._targets = np.concatenate([s.labels for s in self.shards]).astype(np.int64)[rows]
        bad = np.flatnonzero((self._targets < 0) | (self._targets >= len(self._classes)))
        if bad.size:
            raise InvalidValueError(
                f"{self.describe(int(bad[0]))} has label {int(self._targets[bad[0]])}, outside the "
                f"{len(self._classes)} classes {list(self._classes)[:5]}; give every class a name (classes=)."
            )
        self._fds: dict[int, int] | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, in label order."""
        return self._classes

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label (int64), shard after shard."""
        return self._targets

    def describe(self, index: int) -> str:
        """``shard.tar:key`` of sample ``index``."""
        s = int(self._shard_of[index])
        shard = self.shards[s]
        return f"{shard.path}:{shard.keys[int(self._rows[index]) - int(self._starts[s])]}"

    def make_identity(self) -> DataIdentity:
        """Each sample's shard, key and label, and each shard's size, in this order."""
        names = np.concatenate(
            [
                mix(np.array([string_hash(k) for k in shard.keys], dtype=np.uint64))
                ^ np.uint64(string_hash(os.path.basename(shard.path)))
                for shard in self.shards
            ]
        )
        samples = label_hashes(self._targets) ^ mix(names[self._rows])
        sizes = "|".join(str(s.size) for s in self.shards)
        return DataIdentity.of(self.shards[0].path, samples, "tar|" + "/".join(self._classes) + "|" + sizes)

    def _fd(self, s: int) -> int:
        if not self._handles_open() or self._fds is None:
            self._fds = {}
            self._mark_handles_open()
        fd = self._fds.get(s)
        if fd is None:
            shard = self.shards[s]
            fd = os.open(shard.path, os.O_RDONLY)
            try:
                shard.check_unchanged(os.fstat(fd))
            except Exception:
                os.close(fd)
                raise
            self._fds[s] = fd
        return fd

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """Each sample's image bytes, one ``pread`` each (an ``OSError`` in its place where a read fails)."""
        out: list[Source] = []
        for i in indices.tolist():
            try:
                data = os.pread(self._fd(int(self._shard_of[i])), int(self._sizes[i]), int(self._offsets[i]))
            except DataError:
                raise  # a shard that is not the one indexed: never read, never skipped
            except OSError as err:
                out.append(err)
                continue
            out.append(data if len(data) == self._sizes[i] else OSError(f"{self.describe(i)}: short read"))
        return out
