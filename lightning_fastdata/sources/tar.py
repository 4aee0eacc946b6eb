"""``PairedTarDataset``: images and their targets' payloads from WebDataset tar shards.

A sample is an image member and a payload member of one key (``key.jpg`` + ``key.seg.png`` for a mask:
:mod:`~lightning_fastdata.loading.index.tar_pairs`), read together by one ``pread`` of a local shard or one ranged
request to a shard in a bucket (a batch's requests in flight together, each answer checked against the shard's
version), then rendered through the sample's window as the folder source's are
(:class:`~lightning_fastdata.sources.windowed.WindowedDataset`). Samples are numbered shard after shard,
so an epoch is a global shuffle of all of them, resumable at the exact sample.

With ``shuffle_buffer`` and shards in a bucket, a shard's members are read in runs of about ``block_bytes``, one
request each (:class:`~lightning_fastdata.datasets.group_reads.GroupReads`: a request costs the loader's CPU, a run
serves ~100 samples), and the training order shuffles windows of runs holding about ``shuffle_buffer`` samples
(``windows``), as webdataset's shuffle buffer does; a batch whose samples lie in runs not at hand (a full shuffle,
weighted draws) is read one request a sample.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_fastdata.datasets.group_reads import GroupReads, cut_runs
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.tar_pairs import (
    PairedTarIndex,
    index_paired_tar_file,
    load_paired_tar_index,
    member_bytes,
)
from lightning_fastdata.loading.storage.base import is_url, local_files
from lightning_fastdata.loading.storage.ranged import (
    RangedFile,
    RemoteShard,
    bucket_storage,
    read_remote_range,
    shard_indexes,
)
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["PairedTarDataset", "has_tar_shards", "load_paired_shards"]


def has_tar_shards(spec: str) -> bool:
    """Whether the local ``spec`` (a folder, glob or brace pattern) names ``.tar`` files (read as shards by "auto")."""
    return not is_url(spec) and any(p.endswith(".tar") and os.path.isfile(p) for p in local_files(spec, [".tar"]))


def _index_remote(store: Any, shard: RemoteShard, payload_ext: str) -> PairedTarIndex:
    with io.BufferedReader(RangedFile(store, shard), buffer_size=1 << 16) as f:
        return index_paired_tar_file(f, shard.url, shard.size, shard.version, payload_ext)


def load_paired_shards(
    spec: str, index_dir: str, payload_ext: str, storage_options: Mapping[str, Any] | None = None
) -> list[PairedTarIndex]:
    """The indexes of the shards ``spec`` names: a folder of ``.tar`` files, a glob, or a bucket prefix or glob.

    A sample is a key's image member and its ``payload_ext`` member (``seg.png``: ``key.seg.png``). Each index kept in
    ``index_dir`` under its path, size and modification time (an object: its version).

    Raises:
        FileNotFoundError: If nothing matches (named).
    """
    return shard_indexes(
        spec, ".tar", storage_options, lambda path, remote: load_paired_tar_index(path, index_dir, payload_ext, remote),
        _index_remote, payload_ext,
    )  # fmt: skip


class PairedTarDataset(GroupReads, WindowedDataset):
    """The image and payload samples of tar shards (in the order given, each in member order), as whole batches.

    Args:
        shards: Each shard's :class:`~lightning_fastdata.loading.index.tar_pairs.PairedTarIndex`.
        target: What rides with each image (:class:`~lightning_fastdata.sources.target.TargetKind`).
        storage_options: Object-store settings for shards in a bucket (their paths are URLs).
        shuffle_buffer: Shards in a bucket: the training order in windows of runs of members holding about this many
            samples, each run read with one request (module docstring); ``None``: a full shuffle, a request a sample.
        block_bytes: The runs' size in bytes.
        **kwargs: The window settings of :class:`~lightning_fastdata.sources.windowed.WindowedDataset`.

    Raises:
        ValueError: If the shards hold no sample, or mix local files and URLs.
    """

    def __init__(
        self,
        shards: Sequence[PairedTarIndex],
        target: TargetKind,
        storage_options: Mapping[str, Any] | None = None,
        shuffle_buffer: int | None = None,
        block_bytes: int = 8 * 2**20,
        **kwargs: Any,
    ) -> None:
        super().__init__(target.bound("", {}, "the shards"), **kwargs)
        self.shards = list(shards)
        counts = [len(s) for s in self.shards]
        if not sum(counts):
            raise InvalidValueError(f"The shards {[s.path for s in self.shards][:3]} hold no sample.")
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._store: Any = bucket_storage([s.path for s in self.shards], storage_options, "shards")
        self._storage = self._store  # GroupReads' name for it
        self._fds: dict[int, int] = {}
        self._pid = -1
        self._group_pid = -1
        #: Whether samples are read in runs of members (a bucket's shards, with ``shuffle_buffer``).
        self.block_reads = self._store is not None and shuffle_buffer is not None
        #: The training order that reads whole runs (the loader's sampler takes it), or ``None``.
        self.windows = None
        if self.block_reads:
            assert shuffle_buffer is not None
            self._runs(block_bytes)
            self.windows = self.group_windows(shuffle_buffer)

    def _runs(self, block_bytes: int) -> None:
        """Cut each shard into runs of consecutive samples of about ``block_bytes``: each sample's run, their ranges."""
        if not isinstance(block_bytes, int) or block_bytes < 1:
            raise InvalidValueError(f"block_bytes should be a positive size in bytes, got {block_bytes!r}.")
        spans = (np.array([shard.span(k) for k in range(len(shard))], dtype=np.int64).reshape(-1, 2)
                 for shard in self.shards)  # fmt: skip
        self._group_of, self._group_start, self._group_end = cut_runs(spans, block_bytes)

    def __getstate__(self) -> dict[str, Any]:  # descriptors and kept runs never cross a process
        return {**self.__dict__, "_fds": {}, "_pid": -1, "_groups": None, "_pending": None, "_kept_bytes": None,
                "_group_pid": -1}  # fmt: skip

    # -- runs of members (GroupReads) ------------------------------------------------------------------------
    def _handles_open(self) -> bool:
        return self._group_pid == os.getpid()

    def _mark_handles_open(self) -> None:
        self._group_pid = os.getpid()

    def describe(self, index: int) -> str:
        """``shard.tar:key`` of sample ``index``."""
        return self.name(index)

    def group_calls(self, firsts: Sequence[int]) -> tuple[Any, list[tuple[Any, ...]]]:
        """:func:`~lightning_fastdata.loading.storage.ranged.read_remote_range` of each sample's run."""
        calls = []
        for i in firsts:
            shard, g = self.shards[self._locate(i)[0]], int(self._group_of[i])
            calls.append((RemoteShard(shard.path, shard.size, shard.mtime_ns), int(self._group_start[g]),
                          int(self._group_end[g])))  # fmt: skip
        return read_remote_range, calls

    def sample_bytes(self, group: Any, index: int) -> Any:
        """The run's first byte and its bytes, which hold the sample's members (cut by :meth:`read_fields`)."""
        return group

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, index: int) -> tuple[int, int]:
        s = int(np.searchsorted(self._starts, index, side="right") - 1)
        return s, index - int(self._starts[s])

    def name(self, index: int, what: int = 0) -> str:
        """Sample ``index``'s image (``what=0``) or payload (``1``) as messages name it: ``shard.tar:key``."""
        s, k = self._locate(index)
        return f"{self.shards[s].path}:{self.shards[s].keys[k]}{'' if what == 0 else f' ({self.target.what})'}"

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
        """Each sample's ``(start, bytes)`` holding both members, a bucket's requests in flight together.

        Runs of members where samples lie in runs at hand or few (a window of runs); else a request a sample.
        """
        if self.block_reads:
            at = np.asarray(indices, dtype=np.int64)
            if 2 * len(self._missing(at)) <= len(at):
                runs = self.read_grouped(at)
                for run in runs:
                    if isinstance(run, BaseException):
                        raise run
                return runs  # type: ignore[return-value]
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

    def fingerprint(self) -> str:
        """Each file's path, size and version as indexed, and where its image and payload members are."""
        members = hashlib.sha256(b"".join(f.images.tobytes() + f.masks.tobytes() for f in self.shards)).hexdigest()
        return "|".join(f"{f.path}:{f.size}:{f.mtime_ns}" for f in self.shards) + f"|members:{members}"

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each sample's image and payload members, cut from one read of both."""
        out: list[tuple[bytes | torch.Tensor, Any]] = []
        for i, (start, data) in zip(indices, self._spans(indices)):
            s, k = self._locate(i)
            out.append((member_bytes(data, start, self.shards[s].images[k]),
                        member_bytes(data, start, self.shards[s].masks[k])))  # fmt: skip
        return out
