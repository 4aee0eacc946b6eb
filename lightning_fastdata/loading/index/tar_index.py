"""WebDataset tar shards indexed for random access: each sample's image member (its offset and size) and its label.

A WebDataset shard is an uncompressed tar whose members group into samples by key: the member's name up to the
first dot of its base name (``train/n01440764_10026.JPEG`` -> key ``train/n01440764_10026``, extension ``JPEG``);
members of one key are adjacent. :func:`index_tar` reads the headers (and the small label members) and seeks over
the image data, so a sample is then read by one ``pread`` at its offset: an epoch can be a true global shuffle of
every shard's samples, not a shuffle buffer over a stream, and a resume is exact.

A sample's image is its member with extension ``jpg``, ``jpeg``, ``png`` or ``webp`` (any case); its label the
integer in its ``cls`` (or ``txt``) member, or the field ``json_label`` of its ``json`` member. An index is kept in
``index_dir`` under the shard's path, size and modification time (:func:`load_tar_index`): a shard that changed is
indexed again, never read by an old index; a reader also checks the shard it opens (:meth:`TarIndex.check_unchanged`).

Errors name the shard and the member: a truncated shard, a sample without an image or a label, two images of one
key, a label that is not an integer.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.kept import kept_index, refuse_changed, string_array

__all__ = ["IMAGE_EXTENSIONS", "TarIndex", "index_tar", "index_tar_file", "load_tar_index", "split_member"]

#: The extensions of a sample's image member (lower case; matched in any case).
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
#: The version of the kept index files (another version is indexed again).
_FORMAT = 1


@dataclass(frozen=True)
class TarIndex:
    """One shard's samples, in member order.

    Attributes:
        path: The shard.
        size: Its size in bytes when indexed.
        mtime_ns: Its modification time when indexed (a shard in a bucket: its version, of its size and ETag).
        keys: Each sample's key.
        offsets: Each sample's image bytes' offset in the shard (int64).
        sizes: Their sizes (int64).
        labels: Each sample's label (int64).
    """

    path: str
    size: int
    mtime_ns: int
    keys: tuple[str, ...]
    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def check_unchanged(self, st: os.stat_result) -> None:
        """Refuse to read a shard that is not the one indexed (another size or modification time).

        Raises:
            DataError: Naming the shard and what differs.
        """
        refuse_changed("shard", self.path, self.size, self.mtime_ns, st)


def split_member(name: str) -> tuple[str, str]:
    """WebDataset's ``(key, extension)`` of a member name."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (ext if dot else "")


def _label(data: bytes, ext: str, where: str, json_label: str | None) -> int:
    try:
        if ext == "json":
            value = json.loads(data)[json_label]
        else:
            value = data.decode().strip()
        return int(value)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        field = f" (field {json_label!r})" if ext == "json" else ""
        raise DataError(f"{where}: the label{field} is not an integer: {data[:40]!r}.") from None


def index_tar(path: str | os.PathLike[str], json_label: str | None = "label", keep_intact: bool = False) -> TarIndex:
    """Index one uncompressed tar shard (module docstring): the headers and the label members, not the images.

    Raises:
        DataError: On a truncated or unreadable shard (unless ``keep_intact``), a compressed one, or a sample without
            an image or a label (named by shard and member).
    """
    path = os.fspath(path)
    st = os.stat(path)
    with open(path, "rb") as f:
        return index_tar_file(f, path, st.st_size, st.st_mtime_ns, json_label, keep_intact)


def index_tar_file(
    fileobj: IO[bytes],
    path: str,
    size: int,
    version: int,
    json_label: str | None = "label",
    keep_intact: bool = False,
) -> TarIndex:
    """:func:`index_tar` of an open, seekable shard (a local file, or an object read by ranges) of ``size`` bytes.

    ``path`` names it in errors and in the index; ``version`` is its modification time (or an object's version);
    ``json_label=None``: unlabelled samples (to predict on), every label ``-1``. ``keep_intact`` (a module's
    ``on_corrupt="skip"``): a shard cut short (an interrupted copy) keeps the samples whole before the cut, warned with
    how many, instead of an error that stops the run.
    """
    keys: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    labels: list[int] = []
    current: dict[str, object] = {}
    cut = False

    def close() -> None:
        if not current:
            return
        key = str(current["key"])
        if "offset" not in current:
            raise DataError(f"{path}: sample {key!r} has no image member ({', '.join(IMAGE_EXTENSIONS)}).")
        if json_label is None:
            current["label"] = -1  # unlabelled (shards to predict on): label members ignored
        elif "label" not in current:
            raise DataError(f"{path}: sample {key!r} has no label member (.cls, .txt, or .json with {json_label!r}).")
        keys.append(key)
        offsets.append(int(current["offset"]))  # type: ignore[call-overload]
        sizes.append(int(current["size"]))  # type: ignore[call-overload]
        labels.append(int(current["label"]))  # type: ignore[call-overload]
        current.clear()

    try:
        # "r:": no compression (a compressed shard has no random access)
        with tarfile.open(fileobj=fileobj, mode="r:") as tf:
            for member in tf:
                if not member.isfile():
                    continue
                key, ext = split_member(member.name)
                if current and current["key"] != key:
                    close()
                current["key"] = key
                kind = ext.lower()
                where = f"{path}: member {member.name!r}"
                if kind in IMAGE_EXTENSIONS:
                    if "offset" in current:
                        raise DataError(f"{where}: sample {key!r} has two image members; one per sample.")
                    current["offset"], current["size"] = member.offset_data, member.size
                elif kind in ("cls", "txt", "json") and json_label is not None:
                    handle = tf.extractfile(member)
                    assert handle is not None
                    current["label"] = _label(handle.read(), kind, where, json_label)
    except tarfile.TarError as err:
        if not keep_intact:
            raise DataError(
                f"{path} is not a readable uncompressed tar shard ({err}): truncated, compressed, or not a tar. Write "
                "shards with `fastdata convert shards` (or webdataset's ShardWriter), uncompressed."
            ) from None
        cut = True
    cut = cut or _lacks_end(fileobj, size)
    if cut:
        current.clear()  # the sample at the cut may lack members: never a whole one
    else:
        close()
    whole = _whole_samples(path, size, offsets, sizes, cut, keep_intact)
    del keys[whole:], offsets[whole:], sizes[whole:], labels[whole:]
    return TarIndex(
        path,
        size,
        version,
        tuple(keys),
        np.asarray(offsets, dtype=np.int64),
        np.asarray(sizes, dtype=np.int64),
        np.asarray(labels, dtype=np.int64),
    )


def _whole_samples(path: str, size: int, offsets: list[int], sizes: list[int], cut: bool, keep_intact: bool) -> int:
    """How many of a shard's samples (in member order) are whole: all, or those before the cut of a shard cut short.

    Raises:
        DataError: If the shard is cut short and ``keep_intact`` is false, or it holds no whole sample.
    """
    whole = sum(1 for o, n in zip(offsets, sizes) if o + n <= size)  # samples are in member order
    if not cut and whole == len(offsets):
        return whole
    if not keep_intact:
        raise DataError(
            f"{path} is cut short (no tar end after its last member; an interrupted copy?). Copy it again, or "
            "pass on_corrupt='skip' to train on its whole samples."
        )
    if not whole:
        raise DataError(f"{path} is cut short before its first whole sample: copy the shard again.")
    warnings.warn(
        f"{path} is cut short (an interrupted copy?): its first {whole} samples, whole, are read; the rest of it "
        "is lost to this run (on_corrupt='skip'). Copy the shard again to train on all of it.",
        stacklevel=3,
    )
    return whole


def _lacks_end(fileobj: IO[bytes], size: int) -> bool:
    """Whether a tar lacks the zero blocks every writer ends one with (tarfile reads a cut one as if whole)."""
    if size < 1024:
        return True
    fileobj.seek(size - 1024)
    return fileobj.read(1024) != bytes(1024)


def _probe(path: str, offsets: np.ndarray) -> np.ndarray:
    """A digest of the member headers before up to 9 samples' data (first, last, spread between).

    What a kept index checks against its shard: path, size and time alone do not tell it apart from one packed again
    in another order (``cp -p``, reproducible-build times).
    """
    picks: Any = np.unique(np.linspace(0, len(offsets) - 1, 9).astype(np.int64)) if len(offsets) else []
    digest = hashlib.sha256(np.asarray(offsets, dtype=np.int64).tobytes())
    with open(path, "rb") as f:
        for k in picks:
            f.seek(max(0, int(offsets[k]) - 512))
            digest.update(f.read(512))
    return np.frombuffer(digest.digest(), dtype=np.uint8)


def load_tar_index(
    path: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    json_label: str | None = "label",
    remote: tuple[int, int, Callable[[], TarIndex]] | None = None,
    keep_intact: bool = False,
) -> TarIndex:
    """The shard's index: kept in ``index_dir`` under its path, size and modification time, else built and kept.

    Built by :func:`index_tar` and written atomically (:func:`~lightning_fastdata.loading.index.kept.kept_index`); an
    ``index_dir`` that cannot be written is skipped (the index is then built each time). ``remote``: a shard in a
    bucket (``path`` its URL): its size, its version, and what builds its index (reading it by ranges).
    ``keep_intact``: :func:`index_tar_file`'s.
    """

    def load(f: Any, path: str, size: int, version: int) -> TarIndex:
        keys = tuple(str(k) for k in f["keys"])
        if remote is None and not np.array_equal(f["probe"], _probe(path, f["offsets"])):
            raise ValueError("the shard was rewritten with the same size and time")  # built again
        return TarIndex(path, size, version, keys, f["offsets"], f["sizes"], f["labels"])

    def save(index: TarIndex) -> dict[str, np.ndarray]:
        probe = _probe(index.path, index.offsets) if remote is None else np.zeros(0, np.uint8)
        return {"keys": string_array(index.keys), "offsets": index.offsets, "sizes": index.sizes,
                "labels": index.labels, "probe": probe}  # fmt: skip

    settings = f"{_FORMAT}|{json_label}" + ("|intact" if keep_intact else "")  # a cut shard's index is its own
    build = lambda p: index_tar(p, json_label, keep_intact)  # noqa: E731
    return kept_index(path, index_dir, "tar-index", settings, remote, build, load, save)
