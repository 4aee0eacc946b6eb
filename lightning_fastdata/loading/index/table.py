"""Labels from a table: a CSV or Parquet file of image ids and their labels, beside a folder of images.

The Kaggle layout: one folder of images (flat, or nested) and a ``train.csv``. The first column holds each image's
id; the table's other columns its labels (or ``id_column``/``label_column`` name the two to read, the others left
out), in one of three layouts:

- **one label per image** (``multi_label=False``): two columns, ``id,label``;
- **several labels per image in one cell** (``multi_label=True``, two columns): ``id,labels`` with a cell such
  as ``"cat dog"`` (separated by spaces: ``label_separator=" "``, the default) or ``"Atelectasis|Effusion"``
  (``label_separator="|"``, ChestX-ray14's ``Finding Labels``; then a class name may hold spaces); an empty cell:
  no label;
- **one column per class** (``multi_label=True``, more than two columns): ``id,cat,dog,...`` with ``0``/``1``.

An id names a file by its path relative to the folder, with or without its extension (``img_001`` or
``img_001.jpg``), or by its file name alone where that is unique in the folder. The class list is ``classes``
where given (the label order: a label not in it is an error), else the columns' order (one column per class), else
the labels found, sorted (numerically when every label is an integer: ``"2"`` before ``"10"``).

Errors name what is wrong: an id with no file, a file with no row (every image of the folder needs a label: move
unlabelled ones out, or predict on them with ``predict_root``), an id twice, an unknown class, a cell that is not
``0``/``1``. Single labels are ``int64`` positions in the class list, several labels ``uint8`` multi-hot rows
(``N x C``).
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_fastdata.errors import InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.index.files import FileIndex

__all__ = ["LabelTable", "check_label_separator", "labelled_indexes", "read_label_table"]

#: Errors list at most this many ids or files (and say how many there are).
_NAMED = 5


@dataclass(frozen=True)
class LabelTable:
    """A label table as read: its path, the id and label columns, each row's id and label cells.

    ``columns`` is ``(id, label)`` for one label column, else ``(id, class, class, ...)``; ``cells`` holds one
    string per row (one label column) or one tuple of strings per row. ``separator`` splits a cell of several
    labels (``" "``: runs of whitespace); a single label is the whole cell, spaces and all.
    """

    path: str
    columns: tuple[str, ...]
    ids: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    separator: str = " "

    def classes(self, multi_label: bool, classes: Sequence[str] | None = None) -> tuple[str, ...]:
        """The class list (the module docstring's rule).

        Raises:
            ValueError: If ``classes`` is empty or names a class twice, or the layout does not match
                ``multi_label``.
        """
        self._check_layout(multi_label)
        if classes is not None:
            stated = tuple(str(c) for c in classes)
            if not stated or len(set(stated)) != len(stated):
                raise InvalidValueError(f"class_names={list(classes)!r} should name each class once (at least one).")
            return stated
        if len(self.columns) > 2:
            return self.columns[1:]
        found = {token for row in self.cells for token in _tokens(row[0], multi_label, self.separator)}
        if not found:
            raise InvalidValueError(f"{self.path!r} has no label in its column {self.columns[1]!r}.")
        if all(_is_int(c) for c in found):
            return tuple(sorted(found, key=int))
        return tuple(sorted(found))

    def _check_layout(self, multi_label: bool) -> None:
        if len(self.columns) > 2 and not multi_label:
            raise InvalidValueError(
                f"{self.path!r} has {len(self.columns)} columns {list(self.columns[:4])}...; one label per image "
                "needs two (id,label). For one column per class (0/1 cells), pass multi_label=True."
            )

    def labels(self, multi_label: bool, classes: tuple[str, ...]) -> np.ndarray:
        """Each row's label: ``int64`` positions in ``classes``, or ``uint8`` multi-hot rows (``N x C``).

        Raises:
            ValueError: On a class not in ``classes`` or a per-class cell that is not 0/1 (named, with its row).
        """
        self._check_layout(multi_label)
        if len(self.columns) > 2:
            return self._columns_as_multi_hot(classes)
        position = {name: k for k, name in enumerate(classes)}
        out = np.zeros(
            (len(self.ids), len(classes)) if multi_label else len(self.ids), dtype=np.uint8 if multi_label else np.int64
        )
        unknown: list[tuple[int, str]] = []
        for row, (cell,) in enumerate(self.cells):
            tokens = _tokens(cell, multi_label, self.separator)
            if not multi_label and not tokens:
                raise InvalidValueError(f"{self.path!r} row {row + 2} (id {self.ids[row]!r}) has no label.")
            for token in tokens:
                k = position.get(token)
                if k is None:
                    unknown.append((row, token))
                elif multi_label:
                    out[row, k] = 1
                else:
                    out[row] = k
        if unknown:
            names = sorted({token for _, token in unknown})
            row, token = unknown[0]
            raise InvalidValueError(
                f"{self.path!r} has {len(unknown)} label(s) of {len(names)} class(es) not in classes "
                f"({_some(names)}); e.g. row {row + 2} (id {self.ids[row]!r}) says {token!r}. Add them to "
                "class_names=, or drop those rows."
            )
        return out

    def _columns_as_multi_hot(self, classes: tuple[str, ...]) -> np.ndarray:
        header = self.columns[1:]
        missing = [c for c in classes if c not in header]
        extra = [c for c in header if c not in classes]
        if missing or extra:
            raise InvalidValueError(
                f"{self.path!r} has one column per class {_some(list(header))}, which is not "
                f"class_names={list(classes)!r} (missing columns: {_some(missing) or 'none'}; columns not in "
                f"classes: {_some(extra) or 'none'})."
            )
        order = [header.index(c) for c in classes]
        values = np.array([[row[k] for k in order] for row in self.cells], dtype=object).reshape(len(self.ids), -1)
        good = (values == "0") | (values == "1") | (values == "0.0") | (values == "1.0")
        if not good.all():
            row, col = (int(v) for v in np.argwhere(~good)[0])
            raise InvalidValueError(
                f"{self.path!r} row {row + 2} (id {self.ids[row]!r}), column {classes[col]!r} holds "
                f"{values[row, col]!r}; a column per class takes 0 or 1 ({int((~good).sum())} such cell(s))."
            )
        return ((values == "1") | (values == "1.0")).astype(np.uint8)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _tokens(cell: str, multi_label: bool, separator: str) -> list[str]:
    if multi_label:
        return cell.split() if separator == " " else [t.strip() for t in cell.split(separator) if t.strip()]
    cell = cell.strip()
    return [cell] if cell else []


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_NAMED])
    return shown + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")


def check_label_separator(label_separator: str) -> None:
    """Raise unless ``label_separator`` can separate the labels of a cell (not empty, not a comma or a line break).

    Raises:
        ValueError: Naming what it takes.
    """
    if not isinstance(label_separator, str) or not label_separator or label_separator in ",\n\r":
        raise InvalidValueError(
            f"label_separator should be the character(s) between labels in a cell (' ', '|', ';'), got "
            f"{label_separator!r}."
        )


def read_label_table(
    path: str | os.PathLike[str],
    label_separator: str = " ",
    id_column: str | None = None,
    label_column: str | None = None,
) -> LabelTable:
    """Read a ``.csv`` (comma-separated, a header row; ``.tsv``: tab-separated) or ``.parquet`` label table.

    ``label_separator`` splits a cell of several labels (``" "``: runs of whitespace; ``"|"``: ChestX-ray14's).
    ``id_column`` and ``label_column`` name the two columns to read in a table that has others (ChestX-ray14's
    ``Data_Entry_2017.csv``: ``Image Index`` and ``Finding Labels`` of 11 columns); by default the first column holds
    the ids and every other column the labels (one, or one per class).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If it has fewer than two columns or no row, an id is empty or there twice, or a row has
            another number of cells than the header (each named).
        ModuleNotFoundError: For Parquet without ``pyarrow``.
    """
    path = os.fspath(path)
    check_label_separator(label_separator)
    if not os.path.isfile(path):
        raise PathNotFoundError(f"The label table {path!r} does not exist; pass a .csv or .parquet file.")
    if path.lower().endswith((".parquet", ".pq")):
        columns, rows = _read_parquet(path)
    else:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter="\t" if path.lower().endswith(".tsv") else ",")
            header = next(reader, None)
            if header is None:
                raise InvalidValueError(f"The label table {path!r} is empty; it needs a header row (id,label).")
            columns = tuple(c.strip() for c in header)
            rows = []
            for line, row in enumerate(reader, start=2):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(columns):
                    raise InvalidValueError(
                        f"{path!r} line {line} has {len(row)} cells, the header {len(columns)} ({list(columns)[:4]})."
                    )
                rows.append(tuple(c.strip() for c in row))
    if id_column is not None or label_column is not None:
        columns, rows = _select(path, columns, rows, id_column, label_column)
    if len(columns) < 2:
        raise InvalidValueError(
            f"{path!r} has the columns {list(columns)}; a label table needs an id column and a label column (or one "
            "column per class)."
        )
    if not rows:
        raise InvalidValueError(f"{path!r} has a header but no row.")
    ids = tuple(row[0] for row in rows)
    empty = [k for k, i in enumerate(ids) if not i]
    if empty:
        raise InvalidValueError(f"{path!r} row {empty[0] + 2} has an empty id ({len(empty)} such rows).")
    if len(set(ids)) != len(ids):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise InvalidValueError(f"{path!r} names {len(twice)} id(s) more than once: {_some(twice)}.")
    return LabelTable(path, columns, ids, tuple(row[1:] for row in rows), label_separator)


def _select(
    path: str, columns: tuple[str, ...], rows: list[tuple[str, ...]], id_column: str | None, label_column: str | None
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The id column and the label column alone (each named, or the first column for the ids)."""
    wanted = [columns[0] if id_column is None else id_column]
    if label_column is not None:
        wanted.append(label_column)
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise InvalidValueError(f"{path!r} has no column {missing[0]!r}; its columns are {list(columns)}.")
    if label_column is None:  # the ids named, the labels: every other column
        wanted += [c for c in columns if c != wanted[0]]
    if len(set(wanted)) != len(wanted):
        raise InvalidValueError(f"id_column and label_column name the same column {wanted[0]!r} of {path!r}.")
    at = [columns.index(c) for c in wanted]
    return tuple(wanted), [tuple(row[k] for k in at) for row in rows]


def _read_parquet(path: str) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"Reading the Parquet label table {path!r} needs pyarrow: run `pip install 'lightning-fastdata[tables]'` "
            "(or `pip install pyarrow`), or save it as CSV."
        ) from None
    table = pq.read_table(path)
    columns = tuple(table.column_names)
    data = [
        ["" if v is None else (str(int(v)) if isinstance(v, bool) else str(v)) for v in table.column(c).to_pylist()]
        for c in columns
    ]
    return columns, [tuple(row) for row in zip(*data)]


def labelled_indexes(
    folders: Sequence[FileIndex], table: LabelTable, multi_label: bool, classes: Sequence[str] | None = None
) -> list[FileIndex]:
    """Each folder's listing with each file's label from ``table``, in the listing's order.

    Ids and the class list follow the module docstring. One table may label several folders (training,
    validation, test): each id names a file in one of them.

    Raises:
        ValueError: If an id matches no file (or two), or a file has no row (named, with counts).
    """
    class_list = table.classes(multi_label, classes)
    labels = table.labels(multi_label, class_list)
    rows = [_rows_of(images, table) for images in folders]
    missing = set.intersection(*(m for _, m in rows))
    if missing:
        where = " or ".join(repr(images.root) for images in folders)
        ordered = [i for i in table.ids if i in missing]
        raise InvalidValueError(
            f"{len(missing)} of the {len(table.ids)} ids in {table.path!r} have no image under {where}: "
            f"{_some(ordered)}. An id is a file's path relative to the folder (with or without the extension) or its "
            "file name; remove the rows of missing files."
        )
    out = []
    for images, (row_of, _) in zip(folders, rows):
        unlabelled = np.flatnonzero(row_of < 0)
        if unlabelled.size:
            raise InvalidValueError(
                f"{unlabelled.size} of the {len(images)} images under {images.root!r} have no row in {table.path!r}: "
                f"{_some([images.relpath(int(i)) for i in unlabelled])}. Every image of a labelled folder needs a "
                "label; move unlabelled images elsewhere (predict on them with predict_root)."
            )
        out.append(
            FileIndex(images.root, class_list, images.path_bytes, images.offsets, labels[row_of], images.versions)
        )
    return out


def _rows_of(images: FileIndex, table: LabelTable) -> tuple[np.ndarray, set[str]]:
    """Each file's row in ``table`` (-1: none) and the ids that name no file of ``images``.

    Raises:
        ValueError: If an id matches two files of ``images``, or two ids one file.
    """
    names: dict[str, int] = {}
    ambiguous: set[str] = set()
    by_name: dict[str, list[int]] = {}
    for i in range(len(images)):
        rel = images.relpath(i).replace(os.sep, "/")
        stem = os.path.splitext(rel)[0]
        for key in {rel, stem}:
            if key in names:
                ambiguous.add(key)
            names[key] = i
        name = rel.rsplit("/", 1)[-1]
        for key in {name, os.path.splitext(name)[0]} - {rel, stem}:
            by_name.setdefault(key, []).append(i)
    row_of = np.full(len(images), -1, dtype=np.int64)
    missing: set[str] = set()
    unclear: list[str] = []
    for row, ident in enumerate(table.ids):
        key = ident.replace("\\", "/")
        key = key[2:] if key.startswith("./") else key
        found = names.get(key)
        if key in ambiguous or (found is None and len(by_name.get(key, ())) > 1):
            unclear.append(ident)
            continue
        if found is None and len(by_name.get(key, ())) == 1:
            found = by_name[key][0]
        if found is None:
            missing.add(ident)
            continue
        i = found
        if row_of[i] >= 0:
            raise InvalidValueError(
                f"{table.path!r}: the ids {table.ids[row_of[i]]!r} and {ident!r} both name {images.path(i)!r}."
            )
        row_of[i] = row
    if unclear:
        raise InvalidValueError(
            f"{len(unclear)} id(s) of {table.path!r} match more than one file under {images.root!r} (e.g. a.jpg and "
            f"a.png, or one name in two folders): {_some(unclear)}. Write each id as the file's path with its "
            "extension."
        )
    return row_of, missing
