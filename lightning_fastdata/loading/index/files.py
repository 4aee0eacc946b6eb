"""A compact, picklable index of an image folder: one bytes blob of paths plus numpy offsets and labels."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torchvision.datasets import folder as tv_folder

from lightning_fastdata.errors import InvalidValueError, PathNotFoundError

__all__ = [
    "IMG_EXTENSIONS",
    "FileIndex",
    "contains_path",
    "find_classes",
    "refuse_segmentation_root",
    "is_image_name",
    "scan_image_folder",
    "scan_unlabelled",
    "scan_with_mtimes",
]

#: The extensions torchvision's ``ImageFolder`` accepts (its own constant; compared lower-cased).
IMG_EXTENSIONS: tuple[str, ...] = tuple(tv_folder.IMG_EXTENSIONS)
#: The extensions in lower and upper case: one ``str.endswith`` accepts almost every name without ``lower()``.
_EXT_CASES = IMG_EXTENSIONS + tuple(e.upper() for e in IMG_EXTENSIONS)


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
        versions: ``n`` uint64 hashes of each file's size and ETag where a listing gave them (a bucket), else
            ``None``: what identifies the content a listing saw (:mod:`~lightning_fastdata.loading.index.identity`).
    """

    root: str
    classes: tuple[str, ...]
    path_bytes: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    versions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def relpath(self, i: int) -> str:
        """Return the path of sample ``i`` relative to ``root``."""
        return os.fsdecode(self.path_bytes[self.offsets[i] : self.offsets[i + 1]].tobytes())

    def path(self, i: int) -> str:
        """Return the full path of sample ``i``."""
        return os.path.join(self.root, self.relpath(i))

    def subset(self, indices: np.ndarray) -> FileIndex:
        """Return a new index holding only ``indices`` (in that order); vectorised, no per-file Python work."""
        indices = np.asarray(indices, dtype=np.int64)
        starts = self.offsets[indices]
        lengths = self.offsets[indices + 1] - starts
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # byte k of the new blob comes from starts[i] + (k - offsets[i]) for the i whose span holds k
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        versions = None if self.versions is None else self.versions[indices].copy()
        return FileIndex(
            self.root, self.classes, self.path_bytes[gather], offsets, self.labels[indices].copy(), versions
        )

    @classmethod
    def of_paths(
        cls, root: str, relpaths: list[str], versions: np.ndarray | None = None, classes: tuple[str, ...] = ()
    ) -> FileIndex:
        """An index of ``relpaths`` (relative to ``root``, or absolute) in that order.

        Each one's label is its position in the list (unlabelled images: what predictions are matched back to their
        files by).
        """
        encoded = [os.fsencode(p) for p in relpaths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        return cls(root, classes, blob, offsets, np.arange(len(encoded), dtype=np.int64), versions)


def is_image_name(name: str) -> bool:
    """Whether ``name`` has one of torchvision's image extensions (any case)."""
    return name.endswith(_EXT_CASES) or name.lower().endswith(IMG_EXTENSIONS)


def scan_unlabelled(root: str) -> FileIndex:
    """Every image under ``root`` at any depth (flat or nested), sorted by path; labels are positions.

    Raises:
        FileNotFoundError: If ``root`` is not a folder or holds no image (named).
    """
    if not os.path.isdir(root):
        raise PathNotFoundError(f"{root!r} is not a folder; pass a folder of images (flat or nested) or a text file.")
    found: list[str] = []
    for dirpath, _, filenames in os.walk(root):  # the order is the final sort's
        reldir = os.path.relpath(dirpath, root)
        found.extend(name if reldir == "." else os.path.join(reldir, name) for name in filenames if is_image_name(name))
    if not found:
        raise PathNotFoundError(
            f"Found no image under {root!r} (at any depth). Supported extensions are {', '.join(IMG_EXTENSIONS)}."
        )
    return FileIndex.of_paths(root, sorted(found))


def find_classes(root: str) -> tuple[str, ...]:
    """Return the sorted class folder names of ``root``: torchvision's ``find_classes``, with errors that say more.

    Raises:
        FileNotFoundError: If ``root`` does not exist, is not a folder, or holds no class folder (the message
            says which, and the layout expected; torchvision's says "Couldn't find any class folder" for all three).
    """
    if not os.path.isdir(root):
        raise PathNotFoundError(
            f"Image folder {root!r} does not exist or is not a directory. Pass the folder that holds one "
            "sub-folder per class (root/<class>/<image>)."
        )
    try:
        classes, _ = tv_folder.find_classes(root)
    except FileNotFoundError:
        raise PathNotFoundError(
            f"Couldn't find any class folder in {root!r}. Expected one sub-folder per class (root/<class>/<image>)."
        ) from None
    return tuple(classes)


#: Top folders by which a segmentation dataset's root is told from a folder of classes (all of a set present; the
#: last only alone: two classes named so would be a segmentation layout's images and masks).
_SEGMENTATION_FOLDERS = (
    ("VOC", {"JPEGImages", "SegmentationClass"}, False),
    ("Cityscapes", {"leftImg8bit", "gtFine"}, False),
    ("ADE20K or paired", {"images", "annotations"}, True),
)


def refuse_segmentation_root(root: str, classes: Sequence[str]) -> None:
    """Raise if ``root``'s class folders are a segmentation dataset's (its photos and masks are not two classes).

    Raises:
        ValueError: Naming the layout and what reads it (``SegmentationDataModule``).
    """
    found = set(classes)
    for name, folders, alone in _SEGMENTATION_FOLDERS:
        if found == folders if alone else folders <= found:
            raise InvalidValueError(
                f"{root!r} holds {', '.join(sorted(folders))}: a segmentation dataset ({name} layout: images and "
                "their masks), not one sub-folder per class. Train on it with SegmentationDataModule (fastdata fit "
                "--config segmentation; convert it with fastdata convert segmentation)."
            )


def _walk(top: str) -> list[tuple[str, list[str], int, bool]]:
    """``(dirpath, filenames, mtime_ns, all are images)`` under ``top``, sorted; follows folder symlinks, not loops.

    A symlink to a folder that contains it (``a/b -> ..``) would index the same images again and again
    (torchvision's ``ImageFolder`` does, until the path is too long), and one to a folder already walked indexes
    its images twice: both are skipped with a warning naming the link. One ``scandir`` and one ``stat`` per
    folder, none per file (``DirEntry.is_dir`` reads the entry's type). The folders' mtimes let a persisted index
    (:meth:`~lightning_fastdata.loading.index.store.IndexStore.load_folder`) notice a file added, removed or
    renamed.
    """
    st = os.stat(top)
    seen: set[tuple[int, int]] = {(st.st_dev, st.st_ino)}
    found: list[tuple[str, list[str], int, bool]] = []
    stack = [(top, st.st_mtime_ns, st.st_nlink)]
    while stack:
        dirpath, mtime, nlink = stack.pop()
        files, subdirs, clean = _list(dirpath, nlink)
        found.append((dirpath, files, mtime, clean))
        for name in subdirs:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:  # vanished or a dangling symlink: nothing to walk
                continue
            if (st.st_dev, st.st_ino) in seen or (
                os.path.islink(path) and contains_path(os.path.realpath(path), os.path.realpath(dirpath))
            ):
                warnings.warn(
                    f"Skipped {path!r}: it leads to {os.path.realpath(path)!r}, a folder that contains it (a symlink "
                    "loop) or that is already indexed; its images are indexed once.",
                    stacklevel=3,
                )
                continue
            seen.add((st.st_dev, st.st_ino))
            stack.append((path, st.st_mtime_ns, st.st_nlink))
    return sorted(found)


def _list(dirpath: str, nlink: int) -> tuple[list[str], list[str], bool]:
    """``(files, subfolders, every file has an image extension)`` of one folder.

    A folder's link count is 2 + its number of sub-folders on POSIX file systems (ext4, XFS, NFS, Lustre), so
    at 2 it has none and a plain ``listdir`` (names only, ~3x cheaper than ``scandir``'s entries) is enough:
    the leaf folders of an ImageNet-style tree. Symlinks are not counted in it, so the few names without an
    image extension are checked for being (links to) folders. Other link counts (btrfs reports 1) take the
    ``scandir`` path.
    """
    if nlink == 2:
        names = os.listdir(dirpath)
        odd = [n for n in names if not n.endswith(_EXT_CASES)]
        if not odd:
            return names, [], True
        dirs = {n for n in odd if os.path.isdir(os.path.join(dirpath, n))}
        return [n for n in names if n not in dirs], sorted(dirs), False
    files: list[str] = []
    subdirs: list[str] = []
    with os.scandir(dirpath) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows a symlink, as os.walk(followlinks=True)
            except OSError:
                is_dir = False
            (subdirs if is_dir else files).append(entry.name)
    return files, subdirs, False


def contains_path(outer: str, inner: str) -> bool:
    """Whether ``inner`` is ``outer`` or below it (both as given: pass real paths to see through symlinks)."""
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def scan_image_folder(root: str, classes: tuple[str, ...] | None = None) -> FileIndex:
    """Scan ``root/<class>/**/<image>`` into a :class:`FileIndex`, in torchvision's order.

    Files whose extension is not an image extension (``.txt``, ``.DS_Store``) are skipped, and one warning
    counts them. The work per file is a few C-level string operations: each folder's names are filtered with
    ``str.endswith`` (torchvision's test), joined and encoded at once, and split into offsets with numpy.

    Args:
        root: Folder of class sub-folders.
        classes: Class names to use (e.g. the training set's, for a validation folder); default: all found.

    Raises:
        FileNotFoundError: If ``root`` is missing, has no class folder, or a class folder has no image.
    """
    return scan_with_mtimes(root, classes)[0]


def scan_with_mtimes(root: str, classes: tuple[str, ...] | None = None) -> tuple[FileIndex, list[tuple[str, int]]]:
    """:func:`scan_image_folder` and the ``(relative folder, mtime_ns)`` of every folder it walked."""
    if classes is None:
        classes = find_classes(root)
        refuse_segmentation_root(root, classes)
    chunks: list[bytes] = []
    per_label = np.zeros(len(classes), dtype=np.int64)
    dirs: list[tuple[str, int]] = []
    skipped: dict[str, int] = {}
    empty: list[str] = []
    for label, name in enumerate(classes):
        class_dir = os.path.join(root, name)
        if not os.path.isdir(class_dir):
            raise PathNotFoundError(f"Class folder {class_dir!r} is missing; every class must have a folder.")
        found = 0
        for dirpath, fnames, mtime, clean in _walk(class_dir):
            reldir = os.path.relpath(dirpath, root)
            dirs.append((reldir, mtime))
            fnames.sort()
            good = fnames if clean else [f for f in fnames if f.lower().endswith(IMG_EXTENSIONS)]
            if len(good) != len(fnames):
                for f in fnames:
                    if not f.lower().endswith(IMG_EXTENSIONS):
                        ext = os.path.splitext(f)[1].lower() or f.lower()
                        skipped[ext] = skipped.get(ext, 0) + 1
            if good:
                prefix = reldir + os.sep
                # NUL never occurs in a file name: it ends each path, and marks where the next one starts
                chunks.append(os.fsencode(prefix + ("\0" + prefix).join(good) + "\0"))
                found += len(good)
        if not found:
            empty.append(class_dir)
        per_label[label] = found
    if empty:
        raise PathNotFoundError(
            f"Found no valid image in the class folder(s) {', '.join(map(repr, empty))}. Supported extensions are "
            f"{', '.join(IMG_EXTENSIONS)}; add images or remove the empty folder."
        )
    if skipped:
        kinds = ", ".join(f"{ext} ({n})" for ext, n in sorted(skipped.items()))
        warnings.warn(
            f"Skipped {sum(skipped.values())} file(s) under {root!r} that are not images: {kinds}.", stacklevel=3
        )
    blob = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    ends = np.flatnonzero(blob == 0)
    n = len(ends)
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = ends + 1 - np.arange(1, n + 1)
    labels = np.repeat(np.arange(len(classes), dtype=np.int64), per_label)
    return FileIndex(root, classes, blob[blob != 0], offsets, labels), dirs
