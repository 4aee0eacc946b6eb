"""The pieces of an entropy index being built: kept as they are made, resumed after a kill, read while it goes on.

A build (:func:`~lightning_fastdata.loading.jpeg.entropy_index_build.build_entropy_index`, or the paced background
builder) writes its entries in pieces of :func:`piece_files` consecutive files into ``<folder>.building``: each
piece's entries (``<first>.bin``), then their lengths (``<first>.npy``, written last: a piece is whole when its
lengths are there and add up to its bytes). A ``list`` file names the file list they belong to (the index's format,
the list's length and fingerprint); a build of another list empties the folder first.

Three readers of one format:

- :func:`resume_point`: where a killed build goes on (after its last whole piece);
- :func:`join_pieces`: the whole index's blob and offsets, once every piece is there;
- :class:`BuildingPieces`: the entries of the pieces finished so far, for a loader that trains while the index is
  built (:class:`~lightning_fastdata.loading.jpeg.entropy_index.PendingEntropyIndex`): the files of a finished
  piece are decoded with their index from then on, not only once the whole index is done (on a machine the loader
  saturates, the paced build takes tens of epochs).
"""

from __future__ import annotations

import os
import shutil
from bisect import bisect_right
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lightning_fastdata.loading.atomic import atomic_path, atomic_write_bytes, atomic_write_text

__all__ = ["BuildingPieces", "join_pieces", "piece_files", "pieces_folder", "resume_point", "write_piece"]

#: The most files in one piece (the builder holds a piece's entries in memory: ~100 MB at 1.5 KB an entry).
PIECE_FILES = 65536
#: The fewest files in one piece (fewer: more files in the folder and more looks for little gain).
MIN_PIECE_FILES = 64


def piece_files(count: int) -> int:
    """Files per piece for a list of ``count`` files: a 32nd of it, within ``[MIN_PIECE_FILES, PIECE_FILES]``.

    Small lists get small pieces too, so that a loader takes the index up in steps rather than all at the end; a
    killed build loses at most a 32nd of its work. The pieces stay few (32, more only past 2 million files): every
    loader process keeps each piece it took up memory-mapped, and a map holds a file descriptor until the whole
    index replaces the pieces.
    """
    return max(MIN_PIECE_FILES, min(PIECE_FILES, -(-count // 32)))


def _name(first: int) -> str:
    return f"{first:012d}"


def _whole_piece(work: Path, first: int) -> np.ndarray | None:
    """The entry lengths of the piece starting at file ``first``, or ``None`` if it is missing or half written."""
    try:
        lengths = np.load(work / f"{_name(first)}.npy")
        whole = (
            lengths.ndim == 1 and len(lengths) > 0 and (work / f"{_name(first)}.bin").stat().st_size == lengths.sum()
        )
    except (OSError, ValueError, EOFError):
        return None
    return lengths.astype(np.int64) if whole else None


def resume_point(work: Path, stamp: str) -> int:
    """How many files the pieces in ``work`` already hold for the list ``stamp`` names (0: ``work`` emptied)."""
    try:
        same = (work / "list").read_text() == stamp
    except OSError:
        same = False
    if not same:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        atomic_write_text(work / "list", stamp)
        return 0
    done = 0
    while (lengths := _whole_piece(work, done)) is not None:  # the pieces in order, each whole
        done += len(lengths)
    for stale in work.glob("*.npy"):  # a piece after a gap or half written: redone
        if int(stale.stem) >= done:
            stale.unlink(missing_ok=True)
    return done


def write_piece(work: Path, first: int, entries: list[bytes]) -> None:
    """Keep the entries of files ``first, first + 1, ...``: their bytes, then (the mark of a whole piece) lengths."""
    atomic_write_bytes(work / f"{_name(first)}.bin", b"".join(entries), fsync=False)
    with atomic_path(work / f"{_name(first)}.npy", fsync=False) as tmp, open(tmp, "wb") as f:
        np.save(f, np.array([len(e) for e in entries], dtype=np.int64))


def join_pieces(work: Path, blob: BinaryIO) -> np.ndarray:
    """Write the pieces' entries, in order, to ``blob``; return the offsets (one per file and one more)."""
    lengths = [np.zeros(1, dtype=np.int64)]
    for lengths_path in sorted(work.glob("*.npy")):
        lengths.append(np.load(lengths_path))
        blob.write((work / f"{lengths_path.stem}.bin").read_bytes())
    return np.cumsum(np.concatenate(lengths))


class BuildingPieces:
    """The entries of the pieces a build of one file list has finished so far (read-only; one per process).

    :meth:`refresh` takes up the pieces finished since the last call (while ``work``'s ``list`` still names this
    list); :meth:`get` answers for the files they cover and ``None`` for the others. A piece taken up stays usable
    after the build joins the pieces and deletes them (its bytes are memory-mapped). A piece of another list (the
    folder emptied by a build of a changed list between two reads) could only give entries whose file hash does not
    match: the decoder then decodes without them, the same pixels.

    Args:
        work: The ``<folder>.building`` folder.
        stamp: What its ``list`` file holds for this file list.
    """

    def __init__(self, work: Path, stamp: str) -> None:
        self.work = work
        self.stamp = stamp
        self.starts: list[int] = []
        self.covered = 0
        self._pieces: list[tuple[np.ndarray, np.ndarray]] = []  # (offsets, bytes) of each piece

    def _same_list(self) -> bool:
        try:
            return (self.work / "list").read_text() == self.stamp
        except OSError:
            return False

    def refresh(self) -> int:
        """Take up the pieces finished since the last call; return how many files are covered now."""
        while self._same_list() and (lengths := _whole_piece(self.work, self.covered)) is not None:
            path = self.work / f"{_name(self.covered)}.bin"
            try:
                blob = np.memmap(path, np.uint8, "r") if int(lengths.sum()) else np.zeros(0, np.uint8)
            except (OSError, ValueError):  # joined and deleted meanwhile
                break
            if not self._same_list():  # the folder was reset while this piece was read
                break
            self.starts.append(self.covered)
            self._pieces.append((np.concatenate([[0], np.cumsum(lengths)]), blob))
            self.covered += len(lengths)
        return self.covered

    def get(self, i: int) -> bytes | None:
        """File ``i``'s entry if a piece taken up covers it and it has one, else ``None``."""
        if not 0 <= i < self.covered:
            return None
        k = bisect_right(self.starts, i) - 1
        offsets, blob = self._pieces[k]
        j = i - self.starts[k]
        start, end = int(offsets[j]), int(offsets[j + 1])
        return blob[start:end].tobytes() if end > start else None


def pieces_folder(folder: os.PathLike[str] | str) -> Path:
    """Where the pieces of the index folder ``folder`` are kept while it is built."""
    folder = Path(folder)
    return folder.with_name(f"{folder.name}.building")
