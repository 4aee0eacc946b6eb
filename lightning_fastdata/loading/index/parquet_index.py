"""Parquet files of encoded images indexed by row group: each row's label, each row group's rows.

The dataset hubs ship image datasets as Parquet files with an image column of encoded bytes (binary, or the hubs'
``{bytes, path}`` struct) beside a label column (integers, class-name strings, or integers whose names are a
``ClassLabel``'s in the file's ``huggingface`` schema metadata). Parquet compresses a column chunk in pages, so a row
is read with its row group (``pyarrow.parquet.ParquetFile.read_row_group`` of the image column alone): the reader
finds a row by ``(file, row group, row)`` (:class:`ParquetIndex`), and the epoch's order reads each row group in one
piece (:class:`~lightning_fastdata.loading.sampler.ShuffleWindows`).

:func:`index_parquet` reads the footer and the label column only, never the images. An index is kept in
``index_dir`` under the file's path, size and modification time (:func:`load_parquet_index`): a file that changed is
indexed again; a reader checks the file it opens (:meth:`ParquetIndex.check_unchanged`). Errors name the file, the
column and the row: a missing column, an image column that holds no bytes, a row without a label.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.kept import kept_index, refuse_changed, string_array

__all__ = ["ParquetIndex", "open_parquet", "image_values", "index_parquet", "index_parquet_file", "load_parquet_index"]

#: The version of the kept index files (another version is indexed again).
_FORMAT = 2  # 2: the file's own key-value metadata kept


@dataclass(frozen=True)
class ParquetIndex:
    """One Parquet file's rows, in file order.

    Attributes:
        path: The file.
        size: Its size in bytes when indexed.
        mtime_ns: Its modification time when indexed (a file in a bucket: its version, of its size and ETag).
        group_rows: Each row group's number of rows (int64).
        labels: Each row's label (int64): the integer, or the position of its class name in ``label_names``.
        label_names: The class names the labels are positions in (a ``ClassLabel``'s, or the sorted names a string
            column holds); empty for plain integer labels.
        image_column: The column the image bytes are in.
        metadata: The file's key-value metadata, but for the schemas the writers keep there (``ARROW:schema``,
            ``huggingface``, ``pandas``): marks such as the one ``fastdata convert segmentation`` writes, read from a
            file in a bucket as from a local one.
    """

    path: str
    size: int
    mtime_ns: int
    group_rows: np.ndarray
    labels: np.ndarray
    label_names: tuple[str, ...]
    image_column: str
    metadata: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)

    def check_unchanged(self, st: os.stat_result) -> None:
        """Refuse to read a file that is not the one indexed (another size or modification time).

        Raises:
            DataError: Naming the file.
        """
        refuse_changed("Parquet file", self.path, self.size, self.mtime_ns, st)


def open_parquet(index: ParquetIndex) -> Any:
    """The indexed local file as a ``ParquetFile`` kept open for a process's reads, checked to be the one indexed.

    The handle is closed if the check or the footer fails (nothing leaks).

    Raises:
        DataError: If the file changed since it was indexed (named); ``OSError`` if it cannot be opened.
    """
    import pyarrow.parquet as pq

    handle = open(index.path, "rb")  # noqa: SIM115 - kept open with the ParquetFile
    try:
        index.check_unchanged(os.fstat(handle.fileno()))
        return pq.ParquetFile(handle)
    except BaseException:
        handle.close()
        raise


def _class_label_names(schema: object, column: str) -> tuple[str, ...]:
    """The names of ``column``'s ``ClassLabel`` in the hubs' schema metadata (``huggingface``), else ()."""
    metadata = getattr(schema, "metadata", None) or {}
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
        names = features[column]["names"]
    except (KeyError, TypeError, ValueError):
        return ()
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


#: Metadata keys that hold schemas (large, and read elsewhere), not marks.
_SCHEMA_KEYS = ("ARROW:schema", "huggingface", "pandas")


def _marks(schema: object) -> dict[str, str]:
    """A Parquet schema's key-value metadata as text, less the writers' schemas (:data:`_SCHEMA_KEYS`)."""
    metadata = getattr(schema, "metadata", None) or {}
    marks = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in metadata.items()}
    return {k: v for k, v in marks.items() if k not in _SCHEMA_KEYS}


def image_values(column: Any, path: str, name: str) -> Any:
    """The binary values of an image column's array: the column itself, or a ``{bytes, path}`` struct's ``bytes``.

    Raises:
        DataError: If the column holds neither (naming the file and the column).
    """
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = arr.type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        arr = arr.field("bytes")
        kind = arr.type
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)):
        raise DataError(
            f"{path}: the image column {name!r} holds {column.type}, not encoded image bytes (binary, or a struct "
            "with a 'bytes' field as the hubs write it). Name the image column with image_column=."
        )
    return arr


def index_parquet(
    path: str | os.PathLike[str], image_column: str = "image", label_column: str | None = "label"
) -> ParquetIndex:
    """Index one Parquet file (module docstring): its footer and its label column, not the images.

    Raises:
        DataError: If the file is not readable Parquet, a column is missing (the file's columns named), the image
            column holds no bytes, or a row has no label (the row named).
    """
    path = os.fspath(path)
    st = os.stat(path)
    with open(path, "rb") as f:
        return index_parquet_file(f, path, st.st_size, st.st_mtime_ns, image_column, label_column)


def index_parquet_file(
    fileobj: Any,
    path: str,
    size: int,
    version: int,
    image_column: str = "image",
    label_column: str | None = "label",
) -> ParquetIndex:
    """:func:`index_parquet` of an open, seekable file (local, or an object read by ranges) of ``size`` bytes.

    ``path`` names it in errors and in the index; ``version`` is its modification time (or an object's version);
    ``label_column=None``: unlabelled rows (to predict on), every label ``-1``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(fileobj)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path} is not a readable Parquet file ({err}): truncated, or not Parquet.") from None
    schema = pf.schema_arrow
    group_rows = np.array([pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)], dtype=np.int64)
    for role, name in (("image", image_column), ("label", label_column)):
        if name is not None and schema.get_field_index(name) < 0:
            raise DataError(
                f"{path} has no {role} column {name!r}; its columns are {schema.names}. Name it with {role}_column=."
            )
    image_values(pa.array([], type=schema.field(image_column).type), path, image_column)  # its type, checked
    if label_column is None:
        unlabelled = np.full(int(group_rows.sum()), -1, dtype=np.int64)
        return ParquetIndex(path, size, version, group_rows, unlabelled, (), image_column, _marks(schema))
    try:
        column = pf.read(columns=[label_column]).column(0).combine_chunks()
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: the label column {label_column!r} cannot be read ({err}).") from None
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: row {row} has no label (column {label_column!r} is null there).")
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    names = _class_label_names(schema, label_column)
    if pa.types.is_integer(column.type):
        labels = column.to_numpy().astype(np.int64)
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        values = np.asarray(column.to_pylist(), dtype=object)
        names = tuple(sorted(set(values.tolist())))
        labels = np.searchsorted(np.asarray(names, dtype=object), values).astype(np.int64)
    else:
        raise DataError(
            f"{path}: the label column {label_column!r} holds {column.type}; expected integers or class names."
        )
    return ParquetIndex(path, size, version, group_rows, labels, names, image_column, _marks(schema))


def load_parquet_index(
    path: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    image_column: str = "image",
    label_column: str | None = "label",
    remote: tuple[int, int, Callable[[], ParquetIndex]] | None = None,
) -> ParquetIndex:
    """The file's index: kept in ``index_dir`` under its path, size, modification time and columns, else built.

    Built by :func:`index_parquet` and written atomically (:func:`~lightning_fastdata.loading.index.kept.kept_index`);
    an ``index_dir`` that cannot be written is skipped. ``remote``: a file in a bucket (``path`` its URL): its size,
    its version, and what builds its index.
    """

    def load(f: Any, path: str, size: int, version: int) -> ParquetIndex:
        names = tuple(str(n) for n in f["label_names"])
        marks = [str(m) for m in f["metadata"]]
        metadata = dict(zip(marks[::2], marks[1::2]))
        return ParquetIndex(path, size, version, f["group_rows"], f["labels"], names, image_column, metadata)

    def save(index: ParquetIndex) -> dict[str, np.ndarray]:
        marks = [text for pair in index.metadata.items() for text in pair]
        return {
            "group_rows": index.group_rows, "labels": index.labels, "label_names": string_array(index.label_names),
            "metadata": string_array(marks),
        }  # fmt: skip

    def build(p: str) -> ParquetIndex:
        return index_parquet(p, image_column, label_column)

    settings = f"{_FORMAT}|{image_column}|{label_column}"
    return kept_index(path, index_dir, "parquet-index", settings, remote, build, load, save)
