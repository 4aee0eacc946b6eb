"""Entropy indexes, read: a JPEG crop entropy-decoded alone, not with every row above it.

A baseline JPEG is one Huffman-coded bit stream: to decode a ``RandomResizedCrop`` box, libjpeg entropy-decodes
every row from the top of the image down to the box's last row, across the whole width. That entropy decoding is
most of a crop's decode (the docs' Benchmarks page, "Decoding"). An *entropy index* records, at every K-th MCU of
each MCU row (the MCU: the 16 x 16 pixel unit of a 4:2:0 JPEG), where its bits start and the DC predictors there: 10
bytes an entry, K chosen per file to keep the index within :data:`INDEX_FRACTION` (1.5%) of its bytes (one entry per
MCU was 7% of a photo's bytes, 13% of a small quality-75 one). With it,
:func:`~lightning_fastdata.loading.jpeg.decode.decode_resized_crop` assembles a small JPEG of the crop's MCUs (their
original bits; only each row's first DC values re-encoded) and decodes that: the same pixels, bit for bit, with the
entropy decoding of the crop alone (plus at most K - 1 MCUs parsed at the start of each of its rows, to reach its
first MCU from the entry before).

:func:`~lightning_fastdata.loading.jpeg.entropy_index_build.build_entropy_index` (in
:mod:`~lightning_fastdata.loading.jpeg.entropy_index_build`, beside the paced background builder) reads every file
once (a process pool; a bucket's objects through the same
:class:`~lightning_fastdata.loading.storage.base.Storage` as training) and writes one folder in ``index_dir``: the
user's data is never written to. The folder is built under a temporary name and renamed, under a file lock, and
records a fingerprint of the file list it indexes: a list with other files (added, removed, renamed) is rebuilt.
Each file's own index also holds the file's length and a hash of its bytes: a file changed in place since is
decoded without it (the same pixels as ever, at the old speed; logged once per process).

JPEGs the index cannot serve (progressive, arithmetic-coded, with a restart interval that is not whole MCU rows,
CMYK, 12-bit) or would not speed up (fewer than :data:`INDEX_MIN_BYTES_PER_BLOCK` entropy-coded bytes per block),
and other formats, get an empty entry and are decoded as before. Memory: the folder is memory-mapped; each worker
reads only the entries of the images it decodes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from lightning_fastdata._ext import native
from lightning_fastdata._ext.native import entropy_index_available
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.jpeg.pieces import (
    BuildingPieces,
    pieces_folder,
)
from lightning_fastdata.loading.storage.base import is_url

__all__ = [
    "FORMAT",
    "INDEX_FRACTION",
    "INDEX_MIN_BYTES_PER_BLOCK",
    "NO_INDEX",
    "EntropyIndexes",
    "PendingEntropyIndex",
    "build_stamp",
    "fingerprint",
    "default_index_dir",
    "entropy_index_available",
    "entropy_index_folder",
    "index_file",
    "load_entropy_index",
    "warn_once",
    "why_unusable",
]

log = logging.getLogger("lightning_fastdata")

#: The folder format this version writes and reads (3 has an entry every K MCUs, 2 had one at every MCU).
FORMAT = 3
#: The most an index may take of its file's bytes (it takes less where one entry per MCU row is enough).
INDEX_FRACTION = 0.015
#: Files with fewer entropy-coded bytes per 8 x 8 block get no index (flat content, low qualities), because their
#: entropy decoding is too cheap for the index to pay for its fixed cost per crop (in the first JPEG-matrix run,
#: ``benchmarks/results/jpeg-matrix-first.json``, flat 800 x 600 content at ~4 bytes a block was 0.93x as fast
#: with one, and 11-13 bytes a block gained nothing).
INDEX_MIN_BYTES_PER_BLOCK = 16.0

_jpegroi: Any = native.jpegroi  # optional (no libjpeg-turbo headers at install): None


def _root(index: FileIndex) -> str:
    """The list's root as one name everywhere: a URL as it is, a folder as its absolute path.

    ``data/train`` given relative from two projects must not share an entry of the user cache.
    """
    return index.root if is_url(index.root) else os.path.abspath(index.root)


def fingerprint(index: FileIndex) -> str:
    """The identity of a file list: its root and every relative path, in order."""
    digest = hashlib.sha256(os.fsencode(_root(index)) + b"\0")
    digest.update(np.ascontiguousarray(index.path_bytes).tobytes())
    digest.update(np.ascontiguousarray(index.offsets, dtype=np.int64).tobytes())
    return digest.hexdigest()


def entropy_index_folder(index_dir: str | os.PathLike[str], index: FileIndex) -> Path:
    """Where the indexes of ``index``'s files are kept: one folder per data root.

    :func:`~lightning_fastdata.loading.jpeg.entropy_index_build.build_entropy_index` writes it.
    """
    return Path(index_dir) / f"entropy-{hashlib.sha256(os.fsencode(_root(index))).hexdigest()[:16]}"


def index_file(data: bytes, url: str = "", fraction: float = INDEX_FRACTION) -> bytes:
    """One file's entropy index, or ``b""`` where there is none.

    None: not a JPEG this index can serve, or one too cheap to decode for an index to pay
    (:data:`INDEX_MIN_BYTES_PER_BLOCK`). ``url`` names the file (unused: the signature of a build's per-file step);
    ``fraction``: the index's budget as a share of the file's bytes (1.0: an entry per MCU).
    """
    if _jpegroi is None or not data.startswith(b"\xff\xd8\xff"):
        return b""
    built = _jpegroi.entropy_index(data, fraction, 0, INDEX_MIN_BYTES_PER_BLOCK)
    return b"" if built is None else bytes(built)


class EntropyIndexes:
    """The entropy indexes of one file list, in its order; memory-mapped in each process that reads them.

    Picklable (only the folder is pickled), so a dataset holding it works in ``spawn``-ed workers too.

    Args:
        folder: A folder written by :func:`~lightning_fastdata.loading.jpeg.entropy_index_build.build_entropy_index`.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = os.fspath(folder)
        meta = json.loads((Path(folder) / "meta.json").read_text())
        self.count = int(meta["count"])
        self._maps: tuple[np.ndarray, np.ndarray] | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None, "_pid": -1}

    def __len__(self) -> int:
        return self.count

    def get(self, i: int) -> bytes | None:
        """File ``i``'s index, or ``None`` if it has none."""
        if self._pid != os.getpid():  # first use in this process (a forked worker must not share the parent's maps)
            offsets = np.load(os.path.join(self.folder, "offsets.npy"), mmap_mode="r")
            size = int(offsets[-1])
            blob = np.memmap(os.path.join(self.folder, "blob.bin"), np.uint8, "r") if size else np.zeros(0, np.uint8)
            self._maps, self._pid = (offsets, blob), os.getpid()
        offsets, blob = self._maps  # type: ignore[misc]
        start, end = int(offsets[i]), int(offsets[i + 1])
        return blob[start:end].tobytes() if end > start else None


def why_unusable(folder: Path, index: FileIndex) -> str | None:
    """Why ``folder`` cannot serve ``index`` (``None``: it can): missing, of another file list, or damaged."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        return NO_INDEX
    except (OSError, ValueError) as err:
        return f"its meta.json is unreadable ({err})"
    if not isinstance(meta, dict):
        return "its meta.json is not an index's"
    if meta.get("format") != FORMAT:
        return f"it is of format {meta.get('format')!r}, this version reads {FORMAT}"
    if meta.get("fingerprint") != fingerprint(index) or meta.get("count") != len(index):
        return "the file list changed since it was built"
    try:
        offsets = np.load(folder / "offsets.npy", mmap_mode="r")
    except (OSError, ValueError, EOFError) as err:
        return f"its offsets.npy is unreadable ({err})"
    if offsets.shape != (len(index) + 1,) or offsets.dtype.kind != "i":
        return f"its offsets.npy holds {offsets.shape} {offsets.dtype}, not one offset per file and one more"
    if int(offsets[0]) != 0 or bool((np.diff(offsets) < 0).any()):
        return "its offsets are out of order"
    try:
        blob_bytes = (folder / "blob.bin").stat().st_size
    except OSError:
        blob_bytes = 0
    if blob_bytes < int(offsets[-1]):
        return f"its blob.bin holds {blob_bytes:,} of its {int(offsets[-1]):,} bytes (truncated)"
    return None


#: What :func:`_valid` says of a folder with no index in it.
NO_INDEX = "no index yet"
_WARNED: set[str] = set()


def warn_once(folder: Path, message: str) -> None:
    """Warn ``message`` about ``folder`` once per process (the first word on a folder is the one users see)."""
    key = os.fspath(folder)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message)


def load_entropy_index(index_dir: str | os.PathLike[str], index: FileIndex) -> EntropyIndexes | None:
    """The entropy indexes of ``index``'s files kept in ``index_dir``, or ``None`` if there are none of this list.

    A folder that cannot serve the list (none yet, another file list, damaged: truncated or empty files, offsets out
    of order) gives ``None`` and one warning that names it and why: the files are then decoded without it (the
    same pixels, slower), and the DataModule's ``prepare_data`` rebuilds it.
    """
    folder = entropy_index_folder(index_dir, index)
    why = why_unusable(folder, index)
    if why is None:
        return EntropyIndexes(folder)
    warn_once(
        folder,
        f"lightning_fastdata: the entropy index {folder} cannot be used ({why}): decoding without it (the same "
        "pixels, slower). The DataModule's prepare_data() builds or rebuilds it (the Trainer calls it).",
    )
    return None


def build_stamp(index: FileIndex) -> str:
    """What the ``list`` file of a build's pieces holds for ``index``."""
    return f"{FORMAT} {len(index)} {fingerprint(index)}"


def default_index_dir() -> Path:
    """Where entropy indexes are kept when no ``index_dir`` is given: a per-user cache folder, never the data's.

    ``$LIGHTNING_FASTDATA_CACHE``, else ``$XDG_CACHE_HOME/lightning-fastdata``, else
    ``~/.cache/lightning-fastdata`` (the convention of torch hub and Hugging Face); the indexes go in its
    ``entropy-index`` folder.
    """
    base = os.environ.get("LIGHTNING_FASTDATA_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "lightning-fastdata")
    return Path(base) / "entropy-index"


class PendingEntropyIndex:
    """An entropy index being built elsewhere: the entries of its finished pieces meanwhile, all of them once whole.

    Each process (every loader worker has its own copy) looks at most every ``every`` seconds: for the finished
    folder (a ``stat`` of its ``meta.json``), else for the pieces the build finished since its last look
    (:class:`~lightning_fastdata.loading.jpeg.pieces.BuildingPieces`). The folder is checked against the file list
    (the list's fingerprint) only when that file is new or changed, not at every look (an older index of another
    list may sit there while the new one is built). Picklable.
    """

    def __init__(self, index_dir: str | os.PathLike[str], index: FileIndex, every: float = 5.0) -> None:
        self.folder = entropy_index_folder(index_dir, index)
        self.index = index
        self.every = every
        self._found: EntropyIndexes | None = None
        self._pieces: BuildingPieces | None = None
        self._next = 0.0
        self._checked: int | None = None  # the meta.json (mtime in ns) last found not to serve the list

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_found": None, "_pieces": None, "_next": 0.0, "_checked": None}

    def __len__(self) -> int:
        return len(self.index)

    def _look(self) -> None:
        try:
            stamp = (self.folder / "meta.json").stat().st_mtime_ns
        except OSError:
            stamp = None  # not whole yet
        if stamp is not None and stamp != self._checked:
            if why_unusable(self.folder, self.index) is None:
                self._found, self._pieces = EntropyIndexes(self.folder), None
                return
            self._checked = stamp
        if self._pieces is None:
            self._pieces = BuildingPieces(pieces_folder(self.folder), build_stamp(self.index))
        self._pieces.refresh()

    def covered(self) -> int:
        """How many files it serves now (a look at once): all once the index is whole, else its finished pieces'."""
        if self._found is None:
            self._look()
        if self._found is not None:
            return len(self.index)
        return 0 if self._pieces is None else self._pieces.covered

    def get(self, i: int) -> bytes | None:
        """File ``i``'s index where it is built yet, else ``None`` (decoded without: the same pixels)."""
        if self._found is None:
            now = time.monotonic()
            if now >= self._next:
                self._next = now + self.every
                self._look()
            if self._found is None:
                return None if self._pieces is None else self._pieces.get(i)
        return self._found.get(i)
