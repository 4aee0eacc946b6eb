"""Entropy indexes, built: every file read once into an index folder, in a pool or a paced background process.

What an index is and how it is read: :mod:`~lightning_fastdata.loading.jpeg.entropy_index`. Here,
:func:`build_entropy_index` (``prepare_data``, ``entropy_index=True``) and :func:`start_background_build` (the
default ``"auto"``: training starts at once, every process takes the index up as its pieces are finished).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from lightning_fastdata.errors import UsageError
from lightning_fastdata.loading.atomic import atomic_write_text, replace_folder
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.jpeg.entropy_index import (
    FORMAT,
    INDEX_FRACTION,
    EntropyIndexes,
    build_stamp,
    entropy_index_available,
    entropy_index_folder,
    fingerprint,
    index_file,
    warn_once,
    why_unusable,
)
from lightning_fastdata.loading.jpeg.pace import BUILD_SHARE, InProcess, Pace
from lightning_fastdata.loading.jpeg.pieces import join_pieces, piece_files, pieces_folder, resume_point, write_piece
from lightning_fastdata.loading.storage.base import Storage
from lightning_fastdata.loading.storage.source_reads import CHUNK, init_source_process, map_sources
from lightning_fastdata.loading.workers import CpuBudget

__all__ = ["MIN_FREE_BYTES", "build_entropy_index", "start_background_build"]

log = logging.getLogger("lightning_fastdata")


def build_entropy_index(
    index: FileIndex,
    storage: Storage,
    index_dir: str | os.PathLike[str],
    processes: int | None = None,
    progress: bool = True,
    fraction: float = INDEX_FRACTION,
) -> EntropyIndexes | None:
    """Build (or reuse) the entropy indexes of every file in ``index``, kept in ``index_dir``.

    Reused while it indexes the same file list and is whole; otherwise (none, another file list, damaged) every
    file is read once, in ``processes`` processes (default: the CPUs this process may use), and the folder is
    replaced atomically. Safe to call from several processes at once (a file lock; the second reuses the first's
    result); what killed builds left is removed. Where ``index_dir`` cannot be written (read-only, full, not a
    folder) it warns once and returns the index already there if it is whole, else ``None``: training goes on
    without it.

    Args:
        index: The files, in the order the dataset uses.
        storage: Where they are read from (a local folder or a bucket).
        index_dir: A folder of ours (never inside the data); created if missing.
        processes: Processes that read and index the files.
        progress: Show a progress bar.
        fraction: Each file's index budget as a share of its bytes
            (:data:`~lightning_fastdata.loading.jpeg.entropy_index.INDEX_FRACTION`, the measured best; 1.0: an entry per
            MCU). An index already there is reused whatever budget it was built with.

    Raises:
        DataError: If a file cannot be read (naming it); StorageError: if a bucket does not answer.
        RuntimeError: If this install has no compiled JPEG decoder.
    """
    if not entropy_index_available():
        raise RuntimeError(
            "The entropy index needs the compiled JPEG decoder, which this install lacks (no libjpeg-turbo "
            "headers when it was built): install libjpeg62-turbo-dev (or libjpeg-turbo8-dev) and reinstall."
        )
    folder = entropy_index_folder(index_dir, index)
    try:
        Path(index_dir).mkdir(parents=True, exist_ok=True)
        with FileLock(f"{folder}.lock"):
            return _build_locked(index, storage, folder, processes, progress, fraction=fraction)
    except UsageError:
        raise  # the data itself (a file that cannot be read, a bucket that does not answer): the user must know
    except OSError as err:  # index_dir read-only, full, or not a folder: train on without writing the index
        usable = EntropyIndexes(folder) if why_unusable(folder, index) is None else None
        warn_once(
            folder,
            f"lightning_fastdata: cannot write the entropy index in {os.fspath(index_dir)!r} ({err}): "
            + ("using the index already there." if usable else "training without it (the same pixels, slower).")
            + " Give index_dir a writable folder with room for ~1.5% of the JPEG bytes to build it.",
        )
        return usable


def _remove_dead_builds(folder: Path) -> None:
    """Delete what killed builds of ``folder`` left (``.partial-<pid>``, ``.stale-<pid>``); call under its lock."""
    for kind in ("partial", "stale"):
        for leftover in folder.parent.glob(f"{folder.name}.{kind}-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def _build_locked(
    index: FileIndex,
    storage: Storage,
    folder: Path,
    processes: int | None,
    progress: bool,
    pace: Pace | None = None,
    fraction: float = INDEX_FRACTION,
) -> EntropyIndexes:
    """:func:`build_entropy_index` holding the folder's lock (no other build of it runs: leftovers are dead).

    The entries are kept in pieces (:func:`~lightning_fastdata.loading.jpeg.pieces.piece_files`: a 32nd of the
    files, 64 to 65,536) in ``<folder>.building`` as they are made: a build that is killed (the background builder
    ends with its training process) resumes at its last whole piece, and loaders use the finished pieces meanwhile.
    The pieces are then joined into the index folder, which replaces the old one in one rename.
    """
    _remove_dead_builds(folder)
    why = why_unusable(folder, index)
    if why is None:
        log.info("lightning_fastdata: reused the entropy index %s (%d files).", folder, len(index))
        return EntropyIndexes(folder)
    start = time.perf_counter()
    work = pieces_folder(folder)
    first = resume_point(work, build_stamp(index))
    size = piece_files(len(index))
    resumed = f"; resuming after {first:,} files indexed before" if first else ""
    say = print if progress else log.info  # a background build says it in the log only
    say(f"lightning_fastdata: building the entropy index of {len(index):,} files in {folder} ({why}{resumed})")
    context = get_context("fork" if os.name == "posix" else "spawn")
    pool_cm: Any = (
        contextlib.nullcontext(InProcess(pace))
        if processes == 0
        else context.Pool(processes or CpuBudget.detect().usable, initializer=init_source_process)
    )
    with pool_cm as pool:
        bar = tqdm(total=len(index), initial=first, desc="entropy index", unit="img", disable=not progress)
        piece: list[bytes] = []
        chunk = min(CHUNK, size)
        for entry in map_sources(pool, storage, index, index_file, (fraction,), start=first, chunk=chunk):
            piece.append(entry)
            bar.update()
            if len(piece) == size or first + len(piece) == len(index):
                write_piece(work, first, piece)
                first += len(piece)
                piece = []
        bar.close()
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    try:
        partial.mkdir()
        with open(partial / "blob.bin", "wb") as blob:
            offsets = join_pieces(work, blob)
            blob.flush()
            os.fsync(blob.fileno())
        if len(offsets) != len(index) + 1:  # the pieces do not cover the list: never publish such an index
            raise OSError(f"the pieces in {work} hold {len(offsets) - 1} of {len(index)} files")
        np.save(partial / "offsets.npy", offsets)
        indexed = int(np.count_nonzero(np.diff(offsets)))
        meta = {"format": FORMAT, "count": len(index), "fingerprint": fingerprint(index), "indexed": indexed}
        atomic_write_text(partial / "meta.json", json.dumps(meta))
        replace_folder(partial, folder)  # an index of another file list is moved aside, then deleted
        shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone after the rename; a failed join's half is removed
    took = time.perf_counter() - start
    log.info(
        "lightning_fastdata: built the entropy index of %d files in %s (%.1f s, %.1f MB; %d without one: not "
        "a baseline JPEG it can serve).",
        len(index),
        folder,
        took,
        int(offsets[-1]) / 1e6,
        len(index) - indexed,
    )
    return EntropyIndexes(folder)


#: Free space an index_dir must keep after a background build (a cache must never fill a disk).
MIN_FREE_BYTES = 2 * 1024**3


def start_background_build(index: FileIndex, storage: Storage, index_dir: str | os.PathLike[str]) -> Any:
    """Build the entropy index of ``index`` in a paced background process; return at once.

    Training starts without the index and every process takes it up as it is built, a finished piece at a time
    (:class:`~lightning_fastdata.loading.jpeg.entropy_index.PendingEntropyIndex`): its crops are the same pixels with
    or without it, so the switch may come at any step. The builder holds the folder's lock (another rank's or run's
    builder leaves it be), reads every file once in one process paced by
    :class:`~lightning_fastdata.loading.jpeg.pace.Pace` (``BUILD_SHARE``, 2.5%, of the usable CPUs while the loader
    keeps them busy, the idle ones while some are), and ends with the training process. It does nothing where the
    index is already whole, or where ``index_dir`` cannot be written or has less than ``MIN_FREE_BYTES`` (2 GB) free
    (warned once). Returns the process, or ``None``.
    """
    folder = entropy_index_folder(index_dir, index)
    if why_unusable(folder, index) is None:
        return None
    try:
        Path(index_dir).mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(index_dir).free
    except OSError as err:
        warn_once(
            folder,
            f"lightning_fastdata: cannot keep an entropy index in {os.fspath(index_dir)!r} ({err}): "
            "training without it (the same pixels, slower). Set index_dir (or LIGHTNING_FASTDATA_CACHE) to a "
            "writable folder, or entropy_index=False.",
        )
        return None
    if free < MIN_FREE_BYTES:
        warn_once(
            folder,
            f"lightning_fastdata: {os.fspath(index_dir)!r} has {free / 1e9:.1f} GB free: no entropy "
            "index is built there (it would take ~1.5% of the JPEG bytes). Training goes on without it; free "
            "some space or set index_dir.",
        )
        return None
    context: Any = get_context("fork" if os.name == "posix" else "spawn")
    process = context.Process(target=_background_main, args=(index, storage, folder), daemon=True)
    process.start()
    return process


def _background_main(index: FileIndex, storage: Storage, folder: Path) -> None:
    """The background builder's process: paced, the folder's lock or nothing, one file at a time."""
    init_source_process()
    lock = FileLock(f"{folder}.lock")
    try:
        lock.acquire(timeout=0)
    except Exception:  # noqa: BLE001 - another builder holds it (Timeout), or the lock cannot be made: let it be
        return
    try:
        _build_locked(index, storage, folder, processes=0, progress=False, pace=Pace.for_this_process(BUILD_SHARE))
    except Exception as err:  # noqa: BLE001 - a cache that could not be built must never disturb training
        log.warning("lightning_fastdata: the background entropy index build of %s stopped (%s).", folder, err)
    finally:
        lock.release()
