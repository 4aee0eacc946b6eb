"""Tar shards of images and masks indexed for random access: each sample's image and mask members.

A segmentation sample in a WebDataset shard is an image member (``key.jpg``, ``jpeg``, ``png`` or ``webp``) and a
mask member beside it (``key.seg.png`` by default, ``mask_ext=``: the extension after the key's first dot). The
members of a key are adjacent, so a sample is read by one ``pread`` (or one ranged request) from its first member's
data to its last's. The index is kept in ``index_dir`` under the shard's path, size and modification time (or an
object's version), as a labelled shard's is (:mod:`~lightning_fastdata.loading.index.tar_index`).

Errors name the shard and the sample: a truncated shard, a sample without an image or a mask, two of either. A payload
extension ending with ``?`` (``txt?``) is optional: a key without it or without an image (img2dataset's failed
downloads) is skipped and counted (:attr:`PairedTarIndex.skipped`).
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.kept import kept_index, refuse_changed, string_array
from lightning_fastdata.loading.index.tar_index import IMAGE_EXTENSIONS, split_member

__all__ = ["PairedTarIndex", "index_paired_tar", "index_paired_tar_file", "load_paired_tar_index", "member_bytes"]

#: The version of the kept index files.
_FORMAT = 1


@dataclass(frozen=True)
class PairedTarIndex:
    """One shard's samples (image and mask members), in member order.

    Attributes:
        path: The shard (a path or an object's URL).
        size: Its size in bytes when indexed.
        mtime_ns: Its modification time (an object: its version) when indexed.
        keys: Each sample's key.
        images: Each sample's image data ``(offset, size)`` (int64, ``N x 2``).
        masks: Each sample's mask data ``(offset, size)`` (int64, ``N x 2``).
        skipped: Keys left out for a missing member (an optional payload's: ``mask_ext`` ending with ``?``).
    """

    path: str
    size: int
    mtime_ns: int
    keys: tuple[str, ...]
    images: np.ndarray
    masks: np.ndarray
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.keys)

    def span(self, k: int) -> tuple[int, int]:
        """Sample ``k``'s bytes ``[start, end)``: both members' data (and the headers between)."""
        starts = (int(self.images[k, 0]), int(self.masks[k, 0]))
        ends = (starts[0] + int(self.images[k, 1]), starts[1] + int(self.masks[k, 1]))
        return min(starts), max(ends)

    def check_unchanged(self, st: os.stat_result) -> None:
        """Refuse to read a shard that is not the one indexed.

        Raises:
            DataError: Naming the shard and what differs.
        """
        refuse_changed("shard", self.path, self.size, self.mtime_ns, st)


def index_paired_tar(path: str | os.PathLike[str], mask_ext: str = "seg.png") -> PairedTarIndex:
    """Index one uncompressed local shard of images and masks (module docstring).

    Raises:
        DataError: On a truncated, compressed or unreadable shard, or a sample without (or with two) image or mask.
    """
    path = os.fspath(path)
    st = os.stat(path)
    with open(path, "rb") as f:
        return index_paired_tar_file(f, path, st.st_size, st.st_mtime_ns, mask_ext)


def index_paired_tar_file(fileobj: IO[bytes], path: str, size: int, version: int, mask_ext: str) -> PairedTarIndex:
    """:func:`index_paired_tar` of an open, seekable shard of ``size`` bytes (``version``: its mtime or version)."""
    keys: list[str] = []
    images: list[tuple[int, int]] = []
    masks: list[tuple[int, int]] = []
    current: dict[str, Any] = {}
    optional = mask_ext.endswith("?")  # img2dataset's shards: a failed download leaves a key without its image or text
    wanted = mask_ext.rstrip("?").lower()
    skipped = 0

    def close() -> None:
        nonlocal skipped
        if not current:
            return
        if optional and not ("image" in current and "mask" in current):
            skipped += 1
            current.clear()
            return
        for what in ("image", "mask"):
            if what not in current:
                ext = f" (.{mask_ext})" if what == "mask" else f" ({', '.join(IMAGE_EXTENSIONS)})"
                raise DataError(f"{path}: sample {current['key']!r} has no {what} member{ext}.")
        keys.append(current["key"])
        images.append(current["image"])
        masks.append(current["mask"])
        current.clear()

    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tf:
            for member in tf:
                if not member.isfile():
                    continue
                key, ext = split_member(member.name)
                if current and current["key"] != key:
                    close()
                current["key"] = key
                kind = ext.lower()
                what = "mask" if kind == wanted else "image" if kind in IMAGE_EXTENSIONS else None
                if what is None:
                    continue
                if what in current:
                    raise DataError(f"{path}: member {member.name!r}: sample {key!r} has two {what} members.")
                current[what] = (member.offset_data, member.size)
            close()
    except tarfile.TarError as err:
        raise DataError(
            f"{path} is not a readable uncompressed tar shard ({err}): truncated, compressed, or not a tar."
        ) from None
    spans = [o + s for o, s in images + masks]
    if spans and max(spans) > size:
        raise DataError(f"{path} is truncated: a member ends at byte {max(spans)}, the file has {size}.")
    shape = (-1, 2)
    return PairedTarIndex(
        path, size, version, tuple(keys), np.asarray(images, np.int64).reshape(shape),
        np.asarray(masks, np.int64).reshape(shape), skipped,
    )  # fmt: skip


def load_paired_tar_index(
    path: str,
    index_dir: str | os.PathLike[str],
    mask_ext: str = "seg.png",
    remote: tuple[int, int, Callable[[], PairedTarIndex]] | None = None,
) -> PairedTarIndex:
    """The shard's index, kept in ``index_dir`` (``remote``: a shard in a bucket: its size, version and builder)."""

    def load(f: Any, path: str, size: int, version: int) -> PairedTarIndex:
        skipped = int(f["skipped"]) if "skipped" in f else 0
        return PairedTarIndex(path, size, version, tuple(str(k) for k in f["keys"]), f["images"], f["masks"], skipped)

    def save(index: PairedTarIndex) -> dict[str, np.ndarray]:
        return {"keys": string_array(index.keys), "images": index.images, "masks": index.masks,
                "skipped": np.asarray(index.skipped, np.int64)}  # fmt: skip

    build = lambda p: index_paired_tar(p, mask_ext)  # noqa: E731
    return kept_index(path, index_dir, "tar-pairs", f"{_FORMAT}|{mask_ext}", remote, build, load, save)


def member_bytes(span: bytes, start: int, member: np.ndarray) -> bytes:
    """One member's data out of a sample's span read from ``start``."""
    offset = int(member[0]) - start
    return span[offset : offset + int(member[1])]
