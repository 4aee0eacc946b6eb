"""Atomic writes: a file appears whole under its name, or not at all. The one helper every writer uses.

A file is written as ``.<name>.<host>-<pid>.tmp`` beside its destination (hidden, so a folder listing or a glob
for ``*.h5`` never sees it), flushed to disk, and renamed over the destination (``os.replace``, atomic on
POSIX and Windows within one file system). On an error, also ``KeyboardInterrupt``, the temporary is deleted
and the destination is untouched.

A writer killed outright (SIGKILL, a node lost) leaves its temporary behind. Before each write, leftovers of
the same destination are removed when their writer is known to be gone: written on this host by a process
that no longer exists, or, from another host (a shared file system), not modified for :data:`STALE_SECONDS`
(a live writer keeps touching its file).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "STALE_SECONDS",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "remove_stale_temporaries",
    "replace_folder",
    "side_path",
]

#: A temporary from another host untouched this long is a dead writer's leftover.
STALE_SECONDS = 3600.0


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:64] or "host"


def _temporary(dst: Path, tag: str = "") -> Path:
    return dst.with_name(f".{dst.name}.{_host()}-{os.getpid()}{tag}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's) or cannot tell: keep its file
    return True


def remove_stale_temporaries(dst: str | os.PathLike[str]) -> list[Path]:
    """Delete the leftovers of killed writers of ``dst`` (see the module docstring); return what was deleted."""
    dst = Path(dst)
    prefix, host = f".{dst.name}.", _host()
    removed: list[Path] = []
    if not dst.parent.is_dir():
        return removed
    for leftover in dst.parent.glob(f".{dst.name}.*.tmp"):
        writer = leftover.name[len(prefix) :].split(".")[0]  # "<host>-<pid>", maybe with a tag after a dot
        owner, _, pid = writer.rpartition("-")
        try:
            if owner == host:
                gone = pid.isdigit() and not _alive(int(pid))
            else:
                gone = time.time() - leftover.stat().st_mtime > STALE_SECONDS
            if gone:
                leftover.unlink()
                removed.append(leftover)
        except OSError:
            continue  # removed meanwhile by another cleaner
    return removed


@contextlib.contextmanager
def atomic_path(dst: str | os.PathLike[str], fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write ``dst`` under; when the block ends without error, rename it to ``dst``.

    Args:
        dst: The destination; its folder must exist.
        fsync: Flush the file to disk before the rename (a crash right after it cannot leave an empty file).
    """
    dst = Path(dst)
    remove_stale_temporaries(dst)
    tmp = _temporary(dst)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def side_path(dst: str | os.PathLike[str], tag: str) -> Path:
    """A second temporary of this writer beside ``dst`` (same naming, so the same cleanup applies)."""
    return _temporary(Path(dst), f".{tag}")


def atomic_write_bytes(dst: str | os.PathLike[str], data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``dst`` atomically."""
    with atomic_path(dst, fsync) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dst: str | os.PathLike[str], text: str, fsync: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``dst`` atomically."""
    atomic_write_bytes(dst, text.encode(), fsync)


def replace_folder(built: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Put the finished folder ``built`` at ``dst``; an older ``dst`` is moved aside first, then deleted.

    Readers see the old folder or the new one, never a mix: each is swapped in by one rename. Both must be on the
    same file system (``built`` beside ``dst``).
    """
    built, dst = Path(built), Path(dst)
    if dst.exists():
        old = dst.with_name(f"{dst.name}.stale-{os.getpid()}")
        os.replace(dst, old)
        os.replace(built, dst)
        shutil.rmtree(old)
    else:
        os.replace(built, dst)
