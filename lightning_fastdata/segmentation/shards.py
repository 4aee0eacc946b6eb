"""``SegmentationTarDataset``: images and masks from WebDataset tar shards.

A sample is an image member and a mask member of one key (``key.jpg`` + ``key.seg.png``:
:mod:`~lightning_fastdata.loading.index.tar_pairs`), read together by one ``pread`` of a local shard or one ranged
request to a shard in a bucket (a batch's requests in flight together, each answer checked against the shard's
version), then rendered through the sample's window as the folder source's are
(:class:`~lightning_fastdata.segmentation.dataset.WindowedSegmentation`). Samples are numbered shard after shard,
so an epoch is a global shuffle of all of them, resumable at the exact sample.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.tar_pairs import (
    PairedTarIndex,
    index_paired_tar_file,
    load_paired_tar_index,
    member_bytes,
)
from lightning_fastdata.loading.storage.ranged import (
    RangedFile,
    RemoteShard,
    bucket_storage,
    read_remote_range,
    shard_indexes,
)
from lightning_fastdata.segmentation.dataset import WindowedSegmentation, read_mask, sample_key
from lightning_fastdata.segmentation.layouts import map_mask, mask_table

__all__ = ["SegmentationTarDataset", "has_tar_shards", "load_segmentation_shards"]


def has_tar_shards(folder: str) -> bool:
    """Whether the local ``folder`` holds ``.tar`` shards (what ``layout="auto"`` reads as shards)."""
    return os.path.isdir(folder) and bool(glob.glob(os.path.join(glob.escape(folder), "*.tar")))


def _index_remote(store: Any, shard: RemoteShard, mask_ext: str) -> PairedTarIndex:
    with io.BufferedReader(RangedFile(store, shard), buffer_size=1 << 16) as f:
        return index_paired_tar_file(f, shard.url, shard.size, shard.version, mask_ext)


def load_segmentation_shards(
    spec: str, index_dir: str, mask_ext: str = "seg.png", storage_options: Mapping[str, Any] | None = None
) -> list[PairedTarIndex]:
    """The indexes of the shards ``spec`` names: a folder of ``.tar`` files, a glob, or a bucket prefix or glob.

    Each kept in ``index_dir`` under its path, size and modification time (an object: its version).

    Raises:
        FileNotFoundError: If nothing matches (named).
    """
    return shard_indexes(
        spec, ".tar", storage_options, lambda path, remote: load_paired_tar_index(path, index_dir, mask_ext, remote),
        _index_remote, mask_ext,
    )  # fmt: skip


class SegmentationTarDataset(WindowedSegmentation):
    """The image and mask samples of tar shards (in the order given, each in member order), as whole batches.

    Args:
        shards: Each shard's :class:`~lightning_fastdata.loading.index.tar_pairs.PairedTarIndex`.
        num_classes: The classes a mask holds.
        label_map: Mask value -> class (or -> ``ignore_index``), or ``"ade20k"``/``"cityscapes"`` (that layout's
            table); ``None``: the values are the classes.
        storage_options: Object-store settings for shards in a bucket (their paths are URLs).
        ignore_index: The mask value of borders and padding.
        **kwargs: The window settings of :class:`~lightning_fastdata.segmentation.dataset.WindowedSegmentation`.

    Raises:
        ValueError: If the shards hold no sample, or mix local files and URLs.
    """

    def __init__(
        self,
        shards: Sequence[PairedTarIndex],
        num_classes: int = 21,
        label_map: Mapping[int, int] | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        ignore_index: int = 255,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, ignore_index=ignore_index, **kwargs)
        self.shards = list(shards)
        counts = [len(s) for s in self.shards]
        if not sum(counts):
            raise InvalidValueError(f"The shards {[s.path for s in self.shards][:3]} hold no sample.")
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if label_map is not None:
            self.table = mask_table("", num_classes, ignore_index, label_map)
        self._store: Any = bucket_storage([s.path for s in self.shards], storage_options, "shards")
        self._fds: dict[int, int] = {}
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fds": {}, "_pid": -1}  # descriptors never cross a process

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, index: int) -> tuple[int, int]:
        s = int(np.searchsorted(self._starts, index, side="right") - 1)
        return s, index - int(self._starts[s])

    def name(self, index: int, what: int = 0) -> str:
        """Sample ``index``'s image (``what=0``) or mask (``1``) as messages name it: ``shard.tar:key``."""
        s, k = self._locate(index)
        return f"{self.shards[s].path}:{self.shards[s].keys[k]}{'' if what == 0 else ' (mask)'}"

    def _read_local(self, s: int, start: int, end: int) -> bytes:
        if self._pid != os.getpid():
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(s)
        if fd is None:
            fd = os.open(self.shards[s].path, os.O_RDONLY)
            self.shards[s].check_unchanged(os.fstat(fd))  # the shard that was indexed, or refused
            self._fds[s] = fd
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise DataError(f"{self.shards[s].path} is shorter than when it was indexed: read it again.")
        return data

    def _spans(self, indices: Sequence[int]) -> list[tuple[int, bytes]]:
        """Each sample's ``(start, bytes)`` of both members, a bucket's requests in flight together."""
        located = [self._locate(i) for i in indices]
        spans = [self.shards[s].span(k) for s, k in located]
        if self._store is None:
            return [(a, self._read_local(s, a, b)) for (s, _), (a, b) in zip(located, spans)]
        calls = []
        for (s, _), (a, b) in zip(located, spans):
            shard = self.shards[s]
            calls.append((RemoteShard(shard.path, shard.size, shard.mtime_ns), a, b))
        out = []
        for result in self._store.run_many(read_remote_range, calls):
            if isinstance(result, BaseException):
                raise result
            out.append(result)
        return out

    def _pair(self, index: int, start: int, data: bytes) -> tuple[bytes, np.ndarray]:
        s, k = self._locate(index)
        image = member_bytes(data, start, self.shards[s].images[k])
        values = read_mask(member_bytes(data, start, self.shards[s].masks[k]), self.name(index, 1))
        return image, values

    def fingerprint(self) -> str:
        """Each file's path, size and version as indexed, and where its image and mask members are (``mask_ext``'s)."""
        members = hashlib.sha256(b"".join(f.images.tobytes() + f.masks.tobytes() for f in self.shards)).hexdigest()
        return "|".join(f"{f.path}:{f.size}:{f.mtime_ns}" for f in self.shards) + f"|members:{members}"

    def masks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every sample's mask as the data's classes, read in groups of 64 samples."""
        for first in range(0, len(self), 64):
            indices = list(range(first, min(first + 64, len(self))))
            for i, (start, data) in zip(indices, self._spans(indices)):
                _, values = self._pair(i, start, data)
                yield i, map_mask(values, self.table, self.name(i, 1), self.num_classes, self.ignore_index)

    def __getitems__(self, keys: Sequence[Any]) -> Any:
        """A batch: images (uint8 ``N x 3 x H x W``) and masks (uint8 ``N x H x W``), padded to the largest."""
        full = [sample_key(k, len(self)) for k in keys]
        samples = []
        spans = self._spans([f[1] for f in full])
        for f, draws, (start, data) in zip(full, self.draws_of(full), spans):
            image, values = self._pair(f[1], start, data)
            names = (self.name(f[1]), self.name(f[1], 1))
            samples.append(self.render(f, image, self.classes_of(values, names[1]), names, draws))
        return self.batch(samples, full)
