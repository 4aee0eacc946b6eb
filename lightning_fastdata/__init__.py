"""lightning-fastdata: DataModules and callbacks that keep the GPU fed."""

from lightning_fastdata.callbacks.fastdata import FastDataCallback
from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.convert import convert_folder_to_hdf5
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datamodules.cache import TensorCacheDataModule
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.datamodules.hdf5 import HDF5DataModule
from lightning_fastdata.datasets.cache import TensorCacheDataset, build_tensor_cache, open_tensor_cache
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.datasets.hdf5 import HDF5Dataset, inspect_hdf5
from lightning_fastdata.loading.index import FileIndex, scan_image_folder
from lightning_fastdata.loading.loaders import PrefetchingDataLoader, PrefetchingStatefulDataLoader, with_prefetch
from lightning_fastdata.loading.normalize import Normalizer
from lightning_fastdata.loading.prefetch import DevicePrefetcher
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.workers import CpuBudget, resolve_num_workers
from lightning_fastdata.models import ImageClassifier

__all__ = [
    "CpuBudget",
    "DataWaitMonitor",
    "DevicePrefetcher",
    "EpochSampler",
    "FastDataCallback",
    "FastDataModule",
    "FileIndex",
    "HDF5DataModule",
    "HDF5Dataset",
    "ImageClassifier",
    "ImageFolderDataModule",
    "ImageFolderDataset",
    "Normalizer",
    "PrefetchingDataLoader",
    "PrefetchingStatefulDataLoader",
    "TensorCacheDataModule",
    "TensorCacheDataset",
    "build_tensor_cache",
    "convert_folder_to_hdf5",
    "inspect_hdf5",
    "open_tensor_cache",
    "resolve_num_workers",
    "scan_image_folder",
    "with_prefetch",
]

__version__ = "0.1.0"
