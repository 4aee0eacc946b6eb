"""``PredictDataset``: the images ``trainer.predict`` reads for a target room, from any source the module trains from.

``predict_root`` is a folder of images (flat or nested), a bucket prefix or a ``.txt`` list of image paths (as every
module's), an HDF5 file (its ``images_key`` dataset: decoded arrays or encoded files), a folder or bucket prefix of
WebDataset tar shards (each sample's image member), or of Parquet files (the image column). Each image is read at the
evaluation size (its shorter side ``base_size``; ``None``: as it is), batches padded; a batch carries each image's own
size, so that a writer puts each prediction back in its image's pixels (:class:`~lightning_fastdata.MaskWriter` a
mask of that size, :class:`~lightning_fastdata.BoxWriter` boxes), named after the input (``relpath``).
"""

from __future__ import annotations

import io
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from lightning_fastdata.augment.geometry import resize_crop_into
from lightning_fastdata.datasets.folder import prediction_index
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.parquet_index import ParquetIndex, image_values, load_parquet_index
from lightning_fastdata.loading.index.tar_index import TarIndex, load_tar_index
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.ranged import (
    RemoteShard,
    bucket_storage,
    index_remote_parquet,
    index_remote_tar,
    read_remote_range,
    read_remote_row_group,
    shard_indexes,
)
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.sources.hdf5 import HDF5_SUFFIXES, pixel_kind
from lightning_fastdata.sources.parquet import has_parquet_files
from lightning_fastdata.sources.tar import has_tar_shards
from lightning_fastdata.sources.window import eval_window
from lightning_fastdata.sources.windowed import padded_batch, sample_key

__all__ = ["PredictBatch", "PredictDataset", "predict_input_path", "predict_input_relpath"]


class PredictBatch(NamedTuple):
    """A ``trainer.predict`` batch of a target room: uint8 ``images``, their ``indices``, and ``sizes``.

    ``sizes`` (``N x 4`` int64): each image's own height and width, then the height and width it was resized to
    (at the batch's top left; the rest is padding): what a prediction is cut to and resized back from.
    """

    images: torch.Tensor
    indices: torch.Tensor
    sizes: torch.Tensor


class _Files:
    """Image files: a folder, a bucket prefix or a ``.txt`` list (``prediction_index``)."""

    def __init__(self, source: str, options: Mapping[str, Any] | None) -> None:
        self.index = prediction_index(source, None if options is None else dict(options))
        self.storage = open_storage(self.index.root, None if options is None else dict(options))

    def __len__(self) -> int:
        return len(self.index)

    def name(self, i: int) -> str:
        return str(self.storage.url(self.index.relpath(i)))

    def relpath(self, i: int) -> str:
        return str(self.index.relpath(i))

    def read(self, indices: Sequence[int]) -> list[Any]:
        return list(self.storage.read_many([self.index.relpath(i) for i in indices]))


class _HDF5:
    """An HDF5 file's images dataset (decoded arrays or one encoded file each), opened per process."""

    def __init__(self, path: str, key: str) -> None:
        from lightning_fastdata.datasets.hdf5_file import open_hdf5

        self.path, self.key = path, key
        with open_hdf5(path) as f:
            if key not in f:
                raise DataError(f"{path} has no dataset {key!r} to predict on: give images_key=.")
            images = f[key]
            if images.dtype.kind != "O" and images.dtype != np.uint8:  # float pixels were cast to 0/1 here
                pixel_kind(images, f"{path}:{key}")  # refused as training refuses them
            self.count, self.dtype_kind, self.shape = len(images), images.dtype.kind, images.shape
        self._file: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": -1}

    def __len__(self) -> int:
        return int(self.count)

    def name(self, i: int) -> str:
        return f"{self.path}:{self.key}[{i}]"

    def relpath(self, i: int) -> str:
        return f"{os.path.splitext(os.path.basename(self.path))[0]}/{i:06d}"

    def read(self, indices: Sequence[int]) -> list[Any]:
        from lightning_fastdata.datasets.hdf5_file import open_hdf5

        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = open_hdf5(self.path), os.getpid()
        images = self._file[self.key]
        out: list[Any] = []
        for i in indices:
            value = images[i]
            if self.dtype_kind == "O" or value.ndim == 1:
                out.append(value if isinstance(value, bytes) else np.asarray(value, np.uint8).tobytes())
                continue
            array = torch.from_numpy(np.ascontiguousarray(value))
            if array.ndim == 2:
                array = array.unsqueeze(0).expand(3, -1, -1)
            elif array.shape[-1] == 3:
                array = array.permute(2, 0, 1)
            out.append(array)
        return out


class _Tar:
    """Tar shards' image members (local or in a bucket), indexed from their headers and kept in ``index_dir``."""

    def __init__(self, spec: str, index_dir: str, options: Mapping[str, Any] | None) -> None:
        self.shards: list[TarIndex] = shard_indexes(
            spec, ".tar", options, lambda path, remote: load_tar_index(path, index_dir, None, remote),
            index_remote_tar, None,
        )  # fmt: skip
        self.store = bucket_storage([s.path for s in self.shards], options, "shards")
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in self.shards])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _at(self, i: int) -> tuple[TarIndex, int]:
        s = int(np.searchsorted(self.starts, i, side="right") - 1)
        return self.shards[s], i - int(self.starts[s])

    def name(self, i: int) -> str:
        shard, k = self._at(i)
        return f"{shard.path}:{shard.keys[k]}"

    def relpath(self, i: int) -> str:
        shard, k = self._at(i)
        return f"{os.path.splitext(os.path.basename(shard.path))[0]}/{shard.keys[k]}"

    def read(self, indices: Sequence[int]) -> list[Any]:
        out: list[Any] = []
        for i in indices:
            shard, k = self._at(i)
            start, size = int(shard.offsets[k]), int(shard.sizes[k])
            if self.store is not None:
                remote = RemoteShard(shard.path, shard.size, shard.mtime_ns)
                out.append(self.store.run_direct(read_remote_range, remote, start, start + size)[1])
                continue
            with open(shard.path, "rb") as f:
                shard.check_unchanged(os.fstat(f.fileno()))
                f.seek(start)
                out.append(f.read(size))
        return out


class _Parquet:
    """Parquet files' image column (local or in a bucket), a row group read at a time (the last few kept)."""

    def __init__(self, spec: str, index_dir: str, column: str, options: Mapping[str, Any] | None) -> None:
        self.files: list[ParquetIndex] = shard_indexes(
            spec, ".parquet", options, lambda path, remote: load_parquet_index(path, index_dir, column, None, remote),
            index_remote_parquet, column, None,
        )  # fmt: skip
        self.store = bucket_storage([f.path for f in self.files], options, "Parquet files")
        self.column = column
        self.starts = np.concatenate([[0], np.cumsum([len(f) for f in self.files])]).astype(np.int64)
        self._groups: OrderedDict[tuple[int, int], Any] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_groups": OrderedDict()}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _at(self, i: int) -> tuple[int, int]:
        f = int(np.searchsorted(self.starts, i, side="right") - 1)
        return f, i - int(self.starts[f])

    def name(self, i: int) -> str:
        f, row = self._at(i)
        return f"{self.files[f].path}:row {row}"

    def relpath(self, i: int) -> str:
        f, row = self._at(i)
        return f"{os.path.splitext(os.path.basename(self.files[f].path))[0]}/{row:06d}"

    def _group(self, f: int, g: int) -> Any:
        key = (f, g)
        if key not in self._groups:
            index = self.files[f]
            if self.store is not None:
                remote = RemoteShard(index.path, index.size, index.mtime_ns)
                values = self.store.run_direct(read_remote_row_group, remote, g, self.column)
            else:
                import pyarrow.parquet as pq

                with open(index.path, "rb") as handle:
                    index.check_unchanged(os.fstat(handle.fileno()))
                    table = pq.ParquetFile(handle).read_row_group(g, columns=[self.column])
                values = image_values(table.column(0), index.path, self.column)
            self._groups[key] = values
            while len(self._groups) > 4:
                self._groups.popitem(last=False)
        return self._groups[key]

    def read(self, indices: Sequence[int]) -> list[Any]:
        out: list[Any] = []
        for i in indices:
            f, row = self._at(i)
            starts = np.concatenate([[0], np.cumsum(self.files[f].group_rows)])
            g = int(np.searchsorted(starts, row, side="right") - 1)
            value = self._group(f, g)[row - int(starts[g])]
            if not value.is_valid:
                raise DataError(f"{self.name(i)} has no image.")
            out.append(value.as_py())
        return out


def _whole(box: tuple[int, int, int, int]) -> Callable[[int, int], tuple[int, int, int, int]]:
    """The box of a whole image, whatever size the decoder reads (an evaluation window's)."""
    return lambda width, height: box


class PredictDataset(Dataset):
    """Images to predict on, each at the evaluation size (its shorter side ``base_size``), batches padded.

    Args:
        source: What ``predict_root`` may be (module docstring).
        base_size: The evaluation size of the shorter side (``None``: each image as it is).
        storage_options: Object-store settings for a bucket ``source``.
        images_key: An HDF5 ``source``: its images dataset.
        image_column: Parquet files: the image column.
        index_dir: Tar shards and Parquet files: where their indexes are kept.
        layout: ``"shards"`` or ``"parquet"`` for a bucket prefix of them; else found from the source.

    Raises:
        FileNotFoundError: If the source holds no image (named).
    """

    def __init__(
        self,
        source: str,
        base_size: int | None = 520,
        storage_options: Mapping[str, Any] | None = None,
        images_key: str = "images",
        image_column: str = "image",
        index_dir: str | None = None,
        layout: str = "auto",
    ) -> None:
        if base_size is not None and base_size < 1:
            raise InvalidValueError(f"base_size should be positive, got {base_size!r}.")
        local = not is_url(source)
        if source.lower().endswith(HDF5_SUFFIXES):
            self.reader: Any = _HDF5(source, images_key)
        elif layout == "shards" or local and has_tar_shards(source):
            self.reader = _Tar(source, index_dir or "", storage_options)
        elif layout == "parquet" or local and has_parquet_files(source):
            self.reader = _Parquet(source, index_dir or "", image_column, storage_options)
        else:
            self.reader = _Files(source, storage_options)
        self.base_size = base_size

    def __len__(self) -> int:
        return len(self.reader)

    def path(self, index: int) -> str:
        """Input ``index``'s path, URL or ``file:sample`` name (the prediction table's ``path``)."""
        return str(self.reader.name(index))

    def relpath(self, index: int) -> str:
        """Input ``index``'s name under ``predict_root`` (what its mask file is named after)."""
        return str(self.reader.relpath(index))

    def __getitems__(self, keys: Sequence[Any]) -> PredictBatch:
        """The images at the base size, their indices and sizes (:class:`PredictBatch`)."""
        indices = [sample_key(k, len(self))[1] for k in keys]
        samples: list[tuple[torch.Tensor, None]] = []
        sizes = []
        for i, value in zip(indices, self.reader.read(indices)):
            if isinstance(value, OSError):
                raise DataError(f"Cannot read {self.path(i)}: {value}.") from value
            if isinstance(value, torch.Tensor):
                height, width = int(value.shape[1]), int(value.shape[2])
            else:
                try:
                    with Image.open(io.BytesIO(value)) as im:
                        width, height = im.size
                except OSError as err:
                    raise DataError(f"Cannot decode image {self.path(i)!r}: {err}.") from None
            win = eval_window(width, height, self.base_size)
            image = torch.zeros(3, *win.size, dtype=torch.uint8)
            if isinstance(value, torch.Tensor):
                resize_crop_into(image, value)
            else:
                decode_resized_crop(value, image, _whole(win.box), False, self.path(i))
            samples.append((image, None))
            sizes.append((height, width, *win.size))
        batch, _ = padded_batch(samples, 0)  # the training batches' padding, without masks
        return PredictBatch(batch, torch.tensor(indices), torch.tensor(sizes, dtype=torch.int64))

    def __getitem__(self, key: Any) -> PredictBatch:
        """A batch of one."""
        return self.__getitems__([key])


def _predicting(module: Any, what: str) -> PredictDataset:
    if not isinstance(module.predict_dataset, PredictDataset):
        raise RuntimeError(f"{type(module).__name__}.{what}() needs setup('predict') with predict_root=.")
    return module.predict_dataset


def predict_input_path(module: Any, index: int) -> str:
    """The path, URL or ``file:sample`` name of prediction input ``index`` (a DataModule's ``predict_path``)."""
    return _predicting(module, "predict_path").path(index)


def predict_input_relpath(module: Any, index: int) -> str:
    """Prediction input ``index``'s name under ``predict_root`` (a DataModule's ``predict_relpath``).

    What a written prediction is named after.
    """
    return _predicting(module, "predict_relpath").relpath(index)
