"""lightning-fastdata: DataModules and callbacks that keep the GPU fed.

The names below are imported on first use (PEP 562), so ``import lightning_fastdata.loading.index.files`` (a spawn
worker unpickling a dataset, a scan in a fresh process) does not pay for importing Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_fastdata._ext.fork import install_fork_guard

install_fork_guard()  # before any loader forks a worker (lightning_fastdata._ext.fork says why)

if TYPE_CHECKING:
    from lightning_fastdata._ext.native import decoder_summary
    from lightning_fastdata.augment.normalize import Normalizer
    from lightning_fastdata.cache.dataset import TensorCacheDataset, build_tensor_cache, open_tensor_cache
    from lightning_fastdata.callbacks.box_writer import BoxWriter
    from lightning_fastdata.callbacks.embeddings import EmbeddingWriter
    from lightning_fastdata.callbacks.fastdata import FastDataCallback
    from lightning_fastdata.callbacks.mask_writer import MaskWriter
    from lightning_fastdata.callbacks.monitor import DataWaitMonitor
    from lightning_fastdata.callbacks.predictions import PredictionWriter
    from lightning_fastdata.captions.datamodule import ImageTextDataModule
    from lightning_fastdata.captions.model import ContrastiveModel
    from lightning_fastdata.convert.hdf5 import convert_folder_to_hdf5
    from lightning_fastdata.datamodules.base import FastDataModule
    from lightning_fastdata.datamodules.cache import TensorCacheDataModule
    from lightning_fastdata.datamodules.folder import ImageFolderDataModule
    from lightning_fastdata.datamodules.hdf5 import HDF5DataModule
    from lightning_fastdata.datamodules.mixed import MixedDataModule
    from lightning_fastdata.datamodules.segmentation import SegmentationDataModule
    from lightning_fastdata.datamodules.shards import ShardDataModule
    from lightning_fastdata.datasets.folder import ImageFolderDataset
    from lightning_fastdata.datasets.hdf5 import HDF5Dataset
    from lightning_fastdata.datasets.hdf5_file import inspect_hdf5
    from lightning_fastdata.detection.datamodule import DetectionDataModule
    from lightning_fastdata.detection.detector import ObjectDetector
    from lightning_fastdata.diagnose import DoctorReport, doctor
    from lightning_fastdata.loading.index.files import FileIndex, scan_image_folder
    from lightning_fastdata.loading.sampler import EpochSampler
    from lightning_fastdata.loading.transport.loaders import (
        PrefetchingDataLoader,
        PrefetchingStatefulDataLoader,
        with_prefetch,
    )
    from lightning_fastdata.loading.transport.prefetch import DevicePrefetcher
    from lightning_fastdata.loading.workers import CpuBudget, resolve_num_workers
    from lightning_fastdata.models import ImageClassifier
    from lightning_fastdata.segmenter import ImageSegmenter

#: Public name -> the module that defines it.
_EXPORTS = {
    "ContrastiveModel": "lightning_fastdata.captions.model",
    "CpuBudget": "lightning_fastdata.loading.workers",
    "DataWaitMonitor": "lightning_fastdata.callbacks.monitor",
    "DevicePrefetcher": "lightning_fastdata.loading.transport.prefetch",
    "DoctorReport": "lightning_fastdata.diagnose",
    "doctor": "lightning_fastdata.diagnose",
    "EpochSampler": "lightning_fastdata.loading.sampler",
    "FastDataCallback": "lightning_fastdata.callbacks.fastdata",
    "FastDataModule": "lightning_fastdata.datamodules.base",
    "BoxWriter": "lightning_fastdata.callbacks.box_writer",
    "EmbeddingWriter": "lightning_fastdata.callbacks.embeddings",
    "FileIndex": "lightning_fastdata.loading.index.files",
    "HDF5DataModule": "lightning_fastdata.datamodules.hdf5",
    "HDF5Dataset": "lightning_fastdata.datasets.hdf5",
    "ImageClassifier": "lightning_fastdata.models",
    "ImageFolderDataModule": "lightning_fastdata.datamodules.folder",
    "ImageSegmenter": "lightning_fastdata.segmenter",
    "MaskWriter": "lightning_fastdata.callbacks.mask_writer",
    "MixedDataModule": "lightning_fastdata.datamodules.mixed",
    "ImageFolderDataset": "lightning_fastdata.datasets.folder",
    "Normalizer": "lightning_fastdata.augment.normalize",
    "PredictionWriter": "lightning_fastdata.callbacks.predictions",
    "PrefetchingDataLoader": "lightning_fastdata.loading.transport.loaders",
    "PrefetchingStatefulDataLoader": "lightning_fastdata.loading.transport.loaders",
    "SegmentationDataModule": "lightning_fastdata.datamodules.segmentation",
    "DetectionDataModule": "lightning_fastdata.detection.datamodule",
    "ImageTextDataModule": "lightning_fastdata.captions.datamodule",
    "ObjectDetector": "lightning_fastdata.detection.detector",
    "ShardDataModule": "lightning_fastdata.datamodules.shards",
    "TensorCacheDataModule": "lightning_fastdata.datamodules.cache",
    "TensorCacheDataset": "lightning_fastdata.cache.dataset",
    "build_tensor_cache": "lightning_fastdata.cache.dataset",
    "convert_folder_to_hdf5": "lightning_fastdata.convert.hdf5",
    "decoder_summary": "lightning_fastdata._ext.native",
    "inspect_hdf5": "lightning_fastdata.datasets.hdf5_file",
    "open_tensor_cache": "lightning_fastdata.cache.dataset",
    "resolve_num_workers": "lightning_fastdata.loading.workers",
    "scan_image_folder": "lightning_fastdata.loading.index.files",
    "with_prefetch": "lightning_fastdata.loading.transport.loaders",
}

__all__ = [
    "ContrastiveModel",
    "CpuBudget",
    "DataWaitMonitor",
    "DevicePrefetcher",
    "DoctorReport",
    "EpochSampler",
    "BoxWriter",
    "EmbeddingWriter",
    "FastDataCallback",
    "FastDataModule",
    "FileIndex",
    "HDF5DataModule",
    "HDF5Dataset",
    "ImageClassifier",
    "ImageFolderDataModule",
    "ImageSegmenter",
    "MaskWriter",
    "MixedDataModule",
    "ImageFolderDataset",
    "Normalizer",
    "PredictionWriter",
    "PrefetchingDataLoader",
    "PrefetchingStatefulDataLoader",
    "SegmentationDataModule",
    "DetectionDataModule",
    "ImageTextDataModule",
    "ObjectDetector",
    "ShardDataModule",
    "TensorCacheDataModule",
    "TensorCacheDataset",
    "build_tensor_cache",
    "convert_folder_to_hdf5",
    "decoder_summary",
    "doctor",
    "inspect_hdf5",
    "open_tensor_cache",
    "resolve_num_workers",
    "scan_image_folder",
    "with_prefetch",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a public name from its module the first time it is used."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_fastdata' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
