"""A compact, picklable index of an image folder: one bytes blob of paths plus numpy offsets and labels."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = ["IMG_EXTENSIONS", "FileIndex", "find_classes", "scan_image_folder"]

#: The extensions torchvision's ``ImageFolder`` accepts (compared lower-cased).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class FileIndex:
    """Relative paths, labels and class names of an image folder, held in a few numpy arrays.

    A list of ``n`` Python strings costs ~100 bytes per file and every worker that touches it copies the
    pages (reference counts are written on read). Here the paths are one ``uint8`` array and an offset
    array, so the index is ~25 bytes per file, shared copy-on-write by forked workers and pickled in one
    memcpy under ``spawn``.

    Args:
        root: The folder the paths are relative to.
        classes: Class names, sorted; a label is a position in this tuple.
        path_bytes: All relative paths as the file system's bytes (``os.fsencode``: any name, also non-UTF-8),
            concatenated.
        offsets: ``n + 1`` offsets into ``path_bytes``.
        labels: ``n`` int64 labels.
    """

    root: str
    classes: tuple[str, ...]
    path_bytes: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def relpath(self, i: int) -> str:
        """Return the path of sample ``i`` relative to ``root``."""
        return os.fsdecode(self.path_bytes[self.offsets[i] : self.offsets[i + 1]].tobytes())

    def path(self, i: int) -> str:
        """Return the full path of sample ``i``."""
        return os.path.join(self.root, self.relpath(i))

    def subset(self, indices: np.ndarray) -> FileIndex:
        """Return a new index holding only ``indices`` (in that order)."""
        parts = [self.path_bytes[self.offsets[i] : self.offsets[i + 1]] for i in indices]
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        blob = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
        return FileIndex(self.root, self.classes, blob, offsets, self.labels[indices].copy())


def find_classes(root: str) -> tuple[str, ...]:
    """Return the sorted class folder names of ``root``, as torchvision's ``find_classes`` does.

    Raises:
        FileNotFoundError: If ``root`` does not exist or holds no class folder.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(
            f"Image folder {root!r} does not exist or is not a directory. Pass the folder that holds one "
            "sub-folder per class (root/<class>/<image>)."
        )
    classes = tuple(sorted(entry.name for entry in os.scandir(root) if entry.is_dir()))
    if not classes:
        raise FileNotFoundError(
            f"Couldn't find any class folder in {root!r}. Expected one sub-folder per class (root/<class>/<image>)."
        )
    return classes


def _walk(top: str) -> list[tuple[str, list[str]]]:
    """``(dirpath, filenames)`` under ``top``, sorted, following directory symlinks but never around a loop.

    A symlink to a folder that contains it (``a/b -> ..``) would index the same images again and again
    (torchvision's ``ImageFolder`` does, until the path is too long), and one to a folder already walked indexes
    its images twice: both are skipped with a warning naming the link. One ``stat`` per folder, none per file.
    """
    seen: set[tuple[int, int]] = set()
    found: list[tuple[str, list[str]]] = []
    for dirpath, dirnames, fnames in os.walk(top, followlinks=True):
        st = os.stat(dirpath)
        seen.add((st.st_dev, st.st_ino))
        keep = []
        for name in dirnames:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:  # a dangling symlink: nothing to walk
                continue
            if (st.st_dev, st.st_ino) in seen or (
                os.path.islink(path) and _contains(os.path.realpath(path), os.path.realpath(dirpath))
            ):
                warnings.warn(
                    f"Skipped {path!r}: it leads to {os.path.realpath(path)!r}, a folder that contains it (a symlink "
                    "loop) or that is already indexed; its images are indexed once.",
                    stacklevel=3,
                )
                continue
            seen.add((st.st_dev, st.st_ino))
            keep.append(name)
        dirnames[:] = keep
        found.append((dirpath, fnames))
    return sorted(found)


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def scan_image_folder(root: str, classes: tuple[str, ...] | None = None) -> FileIndex:
    """Scan ``root/<class>/**/<image>`` into a :class:`FileIndex`, in torchvision's order.

    Files whose extension is not an image extension (``.txt``, ``.DS_Store``) are skipped, and one warning
    counts them.

    Args:
        root: Folder of class sub-folders.
        classes: Class names to use (e.g. the training set's, for a validation folder); default: all found.

    Raises:
        FileNotFoundError: If ``root`` is missing, has no class folder, or a class folder has no image.
    """
    classes = find_classes(root) if classes is None else classes
    rel: list[bytes] = []
    labels: list[int] = []
    skipped: dict[str, int] = {}
    empty: list[str] = []
    for label, name in enumerate(classes):
        class_dir = os.path.join(root, name)
        if not os.path.isdir(class_dir):
            raise FileNotFoundError(f"Class folder {class_dir!r} is missing; every class must have a folder.")
        before = len(rel)
        for dirpath, fnames in _walk(class_dir):
            reldir = os.path.relpath(dirpath, root)
            for fname in sorted(fnames):
                ext = os.path.splitext(fname)[1].lower() or fname.lower()
                if ext in IMG_EXTENSIONS:
                    rel.append(os.fsencode(os.path.join(reldir, fname)))
                    labels.append(label)
                else:
                    skipped[ext] = skipped.get(ext, 0) + 1
        if len(rel) == before:
            empty.append(class_dir)
    if empty:
        raise FileNotFoundError(
            f"Found no valid image in the class folder(s) {', '.join(map(repr, empty))}. Supported extensions are "
            f"{', '.join(IMG_EXTENSIONS)}; add images or remove the empty folder."
        )
    if skipped:
        kinds = ", ".join(f"{ext} ({n})" for ext, n in sorted(skipped.items()))
        warnings.warn(
            f"Skipped {sum(skipped.values())} file(s) under {root!r} that are not images: {kinds}.", stacklevel=2
        )
    lengths = np.fromiter((len(p) for p in rel), dtype=np.int64, count=len(rel))
    offsets = np.zeros(len(rel) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(rel), dtype=np.uint8).copy()
    return FileIndex(root, classes, blob, offsets, np.asarray(labels, dtype=np.int64))
