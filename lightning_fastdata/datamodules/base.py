"""``FastDataModule``: the DataModules' arguments, datasets by stage and Lightning hooks; subclasses build datasets.

The loaders are built in :mod:`~lightning_fastdata.datamodules.loaders`, moved and augmented on the device by
:mod:`~lightning_fastdata.datamodules.transfer`, resumed by :mod:`~lightning_fastdata.datamodules.resume`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from typing_extensions import override

from lightning_fastdata._ext import native
from lightning_fastdata.augment.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalizer
from lightning_fastdata.augment.pipeline import DeviceAugment, as_transform_list
from lightning_fastdata.augment.sample import SampleTransform
from lightning_fastdata.datamodules.arguments import check_decode_on, check_loader_arguments, setting
from lightning_fastdata.datamodules.loaders import LoaderFactory, LoaderSettings, world_of
from lightning_fastdata.datamodules.resume import LoaderResume, ResumableLoader
from lightning_fastdata.datamodules.transfer import DeviceHalf, DeviceTransfer
from lightning_fastdata.datasets.folder import ImageFolderDataset, prediction_index
from lightning_fastdata.datasets.settings import AugmentSettings
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.corrupt import SkipReport
from lightning_fastdata.loading.sampling import EpochDraws, SamplingSettings, Subset
from lightning_fastdata.loading.transport.shm_pool import BatchTransport, resolve_transport

__all__ = ["FastDataModule"]

log = logging.getLogger("lightning_fastdata")


class FastDataModule(LightningDataModule):
    """Base of the package's DataModules: loaders, device-side normalisation, worker resolution.

    Loaders return ``(images, labels)`` with images uint8 ``N x 3 x H x W`` (channels-last); after they reach
    the training device, its ``on_after_batch_transfer``
    (:class:`~lightning_fastdata.datamodules.transfer.DeviceTransfer`) turns them into normalised float32, so
    a quarter of the bytes cross shared memory and PCIe. The train loader is a torchdata ``StatefulDataLoader``.

    The module owns its parts as objects: :attr:`sampling` (what an epoch draws), :attr:`loading` (the loader
    arguments), :attr:`transfer` (transfer settings and the device side of a batch) and :attr:`loaders` (which
    builds every loader); the loader arguments stay readable (and settable) as attributes of the same names.

    Args:
        image_size: Side of the square training and validation images.
        scale: Area range of the training random crop (``RandomResizedCrop``'s ``scale``).
        ratio: Aspect-ratio range of the training random crop.
        crop_fraction: Validation crop as a fraction of the shorter side (0.875: 224 out of 256).
        on_corrupt: ``"raise"`` on a corrupt or truncated image (naming it), or ``"skip"`` it: each skipped image
            is logged and the count is reported after every epoch. A read that fails (network, throttling, timeout,
            permission, a file gone) is not a corrupt image: it raises a ``StorageError`` either way.
        max_corrupt_fraction: With ``on_corrupt="skip"``: the most images an epoch may skip, as a fraction of the
            samples this rank reads in it (rounded up: at least one); one more stops the run with an error saying
            how many and why. 0 stops at the first, 1 never.
        val_fraction: Fraction of the data held out (seeded) for validation when the subclass has no separate
            validation source; 0 for none.
        batch_size: Samples per batch (per rank under DDP).
        num_workers: Loader worker processes, or ``"auto"``: usable CPUs (affinity capped by the cgroup quota)
            divided by the devices on this node, minus one for the main process.
        pin_memory: Pin host batches; ``None`` pins when the Trainer's accelerator is CUDA.
        persistent_workers: Keep workers alive across epochs; ``None`` means yes whenever there are workers.
        prefetch_factor: Batches loaded ahead per worker (torch's default 2 when ``None``).
        shuffle: Reshuffle the training set every epoch.
        drop_last: Drop the last incomplete training batch.
        seed: Seed of shuffling, augmentation and the validation split; same on every rank.
        mean: Per-channel mean (0-1 scale) for normalisation on the device.
        std: Per-channel standard deviation (0-1 scale).
        in_order: Return batches in sampler order (torch's ``in_order``); ``False`` trades order for fewer
            stalls behind one slow batch, and with workers gives up exact mid-epoch resume (torchdata keeps no
            reliable state then; warned once).
        snapshot_every_n_steps: How often the train loader snapshots worker state (torchdata's argument). A
            resume replays the batches since the last snapshot (up to N - 1), and a snapshot every step costs
            (torchdata#1317). ``None``: the Trainer's ``ModelCheckpoint(every_n_train_steps=...)`` interval if
            there is one (snapshots then coincide with checkpoints), else 1.
        block_shuffle: Shuffle blocks of this many consecutive samples instead of single samples (sequential
            reads; less random batches, see :class:`~lightning_fastdata.EpochSampler`). ``None``: full shuffle.
        batch_transport: How batches cross from the workers: ``"shm_pool"`` in a few shared-memory buffers
            each worker reuses (:mod:`~lightning_fastdata.loading.transport.shm_pool`), ``"torch"`` as torch sends
            them (a new shared segment per batch). ``"shm_pool"`` falls back to ``"torch"``, warned, where this torch
            lacks what the pool needs.
        exact_decode: Decode JPEG crops at full size with the exact inverse DCT: the pixels of torchvision's
            ``decode_jpeg``, cropped and resized. The default (``False``) uses the fast integer IDCT and decodes a
            crop at least twice the output at 1/2, 1/4 or 1/8 in the DCT domain: faster, within ~35-46 dB PSNR
            of the exact path (the docs' Benchmarks page, "Decoding", has the measurements).
        train_transforms: A per-sample transform run in the loader workers after the crop and flip: a uint8
            ``3 x S x S`` tensor in, the same shape and dtype out (a ``torchvision.transforms.v2`` transform or
            ``Compose``, e.g. ``TrivialAugmentWide()``, or any callable). Its randomness (torch's generator) is seeded
            from ``(seed, epoch, index)`` for each sample, so a resumed run makes the same pixels. The Training
            recipes page of the docs has the contract and examples.
        val_transforms: The same for validation samples (seeded by index).
        device_transforms: Per-sample policies run on the training device on the uint8 batch, before
            normalisation: :class:`~lightning_fastdata.augment.TrivialAugmentWide`, ``RandAugment`` (torchvision's
            objects are accepted and run per sample), one or a list.
        batch_transforms: Run on the training device after normalisation, with the labels: ``RandomErasing`` (per
            sample), ``torchvision.transforms.v2.MixUp``/``CutMix``/``RandomChoice`` (the labels become soft
            targets), or any callable ``(images, labels) -> (images, labels)``; one or a list, in order.
        val_resize_size: Validation resize of the shorter side before the central crop (torchvision's reference:
            232 for a 224 crop); ``None``: ``val_crop_size / crop_fraction``.
        val_crop_size: Side of the validation images; ``None``: ``image_size``.
        predict_root: What ``trainer.predict`` reads: a folder of images (flat or nested), a bucket prefix, or a
            ``.txt`` file of image paths (``datasets.folder.prediction_index``); batches are
            ``(images, indices)``, :meth:`predict_path` names image ``i``, and
            :class:`~lightning_fastdata.PredictionWriter` writes the table. The validation transforms; ``None``:
            nothing to predict on.
        repeated_augmentations: Each training sample this many times per epoch with different augmentations, the
            repeats on different ranks (torchvision's ``--ra-sampler --ra-reps``); an epoch keeps its length
            (``len(dataset)`` samples over all ranks). 1: off.
        sample_weights: Draw training samples by weight (:mod:`~lightning_fastdata.loading.sampling`):
            ``"balanced"`` (each class equally often), ``"repeat_factor"`` (LVIS's, for boxes), a mapping class
            name -> weight (classes not named: 1), one weight per training sample (``len(dm.train_dataset)``, in
            its order), or a callable of a sample's label (an int, or a multi-hot row) -> weight. ``None``: each
            sample once an epoch. A function of ``(seed, epoch)``, exactly resumable like a plain epoch.
        replacement: With ``sample_weights``: with replacement (default, torch's ``WeightedRandomSampler``), or each
            sample at most once an epoch; without them ``True`` draws uniformly, each draw independent (open_clip's
            ``--dataset-resampled``, by sample), ``None``/``False`` whole permutations.
        epoch_size: Training samples per epoch over all ranks (more or fewer than the set has); ``None``: all.
        classes: Train (and evaluate) on these classes only, in this order: labels are renumbered (``dm.classes``,
            ``num_classes``, linked to the model and its checkpoint), samples of other classes left out.
        max_per_class: At most this many training samples of each class (a seeded choice, fixed for the run).
        fraction: A seeded fraction of the training samples (fixed for the run), e.g. ``0.1`` for a quick run.
        decode_on: Where JPEGs are decoded: ``"workers"`` (only the crop, DCT-scaled) or ``"device"`` (nvJPEG on the
            training GPU, :mod:`~lightning_fastdata.loading.jpeg.device`; the workers draw the same crops and send the
            bytes), for when the workers' decode is the limit (``DataWaitMonitor`` says so). CUDA only; per-sample
            policies then go to ``device_transforms``.

    Raises:
        ValueError: On an impossible combination, e.g. ``prefetch_factor`` with ``num_workers=0``.
    """

    def __init__(
        self,
        image_size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        crop_fraction: float = 0.875,
        on_corrupt: Literal["raise", "skip"] = "raise",
        val_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = None,
        block_shuffle: int | None = None,
        batch_transport: BatchTransport = "shm_pool",
        exact_decode: bool = False,
        max_corrupt_fraction: float = 0.01,
        train_transforms: Callable[[torch.Tensor], Any] | None = None,
        val_transforms: Callable[[torch.Tensor], Any] | None = None,
        device_transforms: Callable[..., Any] | list[Callable[..., Any]] | None = None,
        batch_transforms: Callable[..., Any] | list[Callable[..., Any]] | None = None,
        val_resize_size: int | None = None,
        val_crop_size: int | None = None,
        repeated_augmentations: int = 1,
        predict_root: str | None = None,
        sample_weights: str | dict[str, float] | list[float] | Callable[[Any], float] | None = None,
        replacement: bool | None = None,
        epoch_size: int | None = None,
        classes: list[str] | None = None,
        max_per_class: int | None = None,
        fraction: float | None = None,
        decode_on: Literal["workers", "device"] = "workers",
    ) -> None:
        super().__init__()
        #: What the training epoch draws (weights, epoch_size, a subset of the samples); validated here.
        self.sampling = SamplingSettings(sample_weights, replacement, epoch_size, classes, max_per_class, fraction)
        self._data_classes: tuple[str, ...] | None = None
        check_loader_arguments(
            val_fraction, batch_size, num_workers, prefetch_factor, persistent_workers, block_shuffle,
            snapshot_every_n_steps, repeated_augmentations,
        )  # fmt: skip
        for name, value in (("train_transforms", train_transforms), ("val_transforms", val_transforms)):
            if value is not None:
                SampleTransform(value, seed, name)  # validates (callable)
        self.val_fraction = val_fraction
        # What every image dataset of the package takes, validated here once (the datasets build the same object).
        self.dataset_kwargs: dict[str, Any] = AugmentSettings(
            image_size, scale, ratio, crop_fraction, seed, on_corrupt, exact_decode, max_corrupt_fraction
        ).as_kwargs()
        self.val_crop_size = image_size if val_crop_size is None else val_crop_size
        if self.val_crop_size <= 0 or (val_resize_size is not None and val_resize_size < self.val_crop_size):
            raise InvalidValueError(
                f"val_crop_size should be positive and at most val_resize_size, got val_crop_size={val_crop_size!r}, "
                f"val_resize_size={val_resize_size!r}."
            )
        #: The validation crop as a fraction of the shorter side (``val_crop_size / val_resize_size``).
        self.val_crop_fraction = crop_fraction if val_resize_size is None else self.val_crop_size / val_resize_size
        self.train_transforms = train_transforms
        self.val_transforms = val_transforms
        device_augment = DeviceAugment(
            as_transform_list(device_transforms, "device_transforms"),
            as_transform_list(batch_transforms, "batch_transforms"),
            seed,
        )
        # The parts this module owns: its loader arguments, its transfer settings and device side, the loaders.
        self.loading = LoaderSettings(
            batch_size, shuffle, drop_last, seed, persistent_workers, prefetch_factor, in_order,
            snapshot_every_n_steps, block_shuffle, resolve_transport(batch_transport), repeated_augmentations,
        )  # fmt: skip
        check_decode_on(decode_on, train_transforms, val_transforms)
        self.transfer = DeviceTransfer(Normalizer(mean, std), device_augment, pin_memory, num_workers, decode_on)
        self.loaders = LoaderFactory(self.loading, self.transfer)
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.predict_root = None if predict_root is None else os.fspath(predict_root)  # a Path works as root's does
        self.predict_dataset: ImageFolderDataset | None = None
        # Exact resume: the train loader last built, and what a checkpoint asked of the next one.
        self._train_loader: ResumableLoader | None = None
        self.resume = LoaderResume()
        self.skips = SkipReport()

    # -- the loader arguments, as attributes (Lightning's batch-size finder sets batch_size) -----------
    batch_size = setting("loading", "batch_size")
    shuffle = setting("loading", "shuffle")
    drop_last = setting("loading", "drop_last")
    seed = setting("loading", "seed")
    in_order = setting("loading", "in_order")
    repeated_augmentations = setting("loading", "repeated_augmentations")
    batch_transport = setting("loading", "batch_transport")
    num_workers = setting("transfer", "num_workers")
    pin_memory = setting("transfer", "pin_memory")
    channels_last = setting("transfer", "channels_last")

    @property
    def normalizer(self) -> Normalizer:
        """uint8 to normalised float with this module's ``mean``/``std`` (``denormalize`` for showing images)."""
        return self.transfer.normalizer

    # -- what subclasses provide -----------------------------------------------------------------------
    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Return ``(train_dataset, val_dataset_or_None)``; called once, from :meth:`setup`."""
        raise NotImplementedError

    #: The argument that gives a subclass its test set (named by ``test_dataloader`` when it is missing).
    test_argument = "test_root"
    #: Whether each sample has several labels (``uint8`` multi-hot rows, ``N x num_classes``, in every batch).
    multi_label = False
    #: Whether the module takes ``decode_on="device"`` (image-and-label batches; not masks, boxes or captions).
    device_decode = True

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names, in label order (the data's, or ``classes=`` as given: a subset, in its order)."""
        wanted = self.sampling.classes
        return self.data_classes if wanted is None else tuple(str(c) for c in wanted)

    @classes.setter
    def classes(self, names: tuple[str, ...]) -> None:
        """Set the data's class names (checked against ``classes=`` at once)."""
        self._data_classes = tuple(names)
        self.sampling.check_classes(self._data_classes)

    @property
    def data_classes(self) -> tuple[str, ...]:
        """The data's class names in label order, read (:meth:`find_classes`) on first use and never in ``__init__``.

        Lightning's rule: ``__init__`` reads no data; ``prepare_data``, ``setup`` or ``num_classes`` (LightningCLI's
        link) reads the names first, and checks ``classes=`` against them then.
        """
        if self._data_classes is None:
            self.classes = self.find_classes()
        return self._data_classes  # type: ignore[return-value]  # set by the setter

    def find_classes(self) -> tuple[str, ...]:
        """Read the data's class names (a subclass's: folders, a label table, a file's attribute, shards' labels)."""
        return ()

    def build_test_dataset(self) -> Dataset | None:
        """The test set (validation transforms), or ``None`` where none was given; called from ``setup("test")``."""
        return None

    def build_predict_dataset(self) -> ImageFolderDataset | None:
        """``predict_root``'s images with the validation transforms, unlabelled; called from ``setup("predict")``."""
        if self.predict_root is None:
            return None
        options = self.predict_storage_options()
        index = prediction_index(self.predict_root, options)
        return ImageFolderDataset(index, options, **self.split_kwargs(False))

    def predict_storage_options(self) -> dict[str, Any] | None:
        """The object-store settings a bucket ``predict_root`` is read with (the module's own ``storage_options``)."""
        return None

    def predict_path(self, index: int) -> str:
        """The path (or URL) of prediction input ``index``: what a predict batch's second element refers to."""
        if self.predict_dataset is None:
            raise RuntimeError(f"{type(self).__name__}.predict_path() needs setup('predict') with predict_root=.")
        return self.predict_dataset.storage.url(self.predict_dataset.index.relpath(index))

    def split(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Seeded train/validation split of ``range(n)`` by ``val_fraction`` (same on every rank), each sorted."""
        if self.val_fraction == 0:
            return np.arange(n), None
        order = np.random.default_rng(self.seed).permutation(n)
        n_val = max(1, int(round(n * self.val_fraction)))
        return np.sort(order[n_val:]), np.sort(order[:n_val])

    def split_kwargs(self, train: bool) -> dict[str, Any]:
        """The dataset arguments of the training or the validation split: settings, sizes and per-sample transform."""
        kwargs = dict(self.dataset_kwargs, train=train)
        if train:
            kwargs["transform"] = self.train_transforms
        else:
            kwargs.update(
                image_size=self.val_crop_size, crop_fraction=self.val_crop_fraction, transform=self.val_transforms
            )
        return kwargs

    # -- Lightning hooks -------------------------------------------------------------------------------
    @override
    def setup(self, stage: str) -> None:
        """Build the datasets a stage needs, once (every rank builds its own; they are cheap indexes).

        ``fit`` and ``validate``: the training and validation sets; ``test``: the test set alone. The data's classes
        are read first (and ``classes=`` checked against them).
        """
        self.data_classes  # noqa: B018 - read now: a class ``classes=`` names and the data lacks fails here
        if stage == "test":
            if self.test_dataset is None:
                self.test_dataset = self.build_test_dataset()
        elif stage == "predict":
            if self.predict_dataset is None:
                self.predict_dataset = self.build_predict_dataset()
        elif self.train_dataset is None:
            self.train_dataset, self.val_dataset = self.build_datasets()
        if self.decodes_images():
            native.warn_if_missing()  # once per process, rank zero: JPEGs decode slower without the extension
        else:
            check_decode_on(self.transfer.decode_on, module=self)

    def decodes_images(self) -> bool:
        """Whether this module's loaders decode encoded images (JPEG, PNG...) rather than read decoded pixels."""
        return True

    @override
    def train_dataloader(self) -> StatefulDataLoader:
        """The training loader: shuffled per epoch, sharded across ranks, stateful."""
        if self.train_dataset is None:
            raise RuntimeError(f"{type(self).__name__}.train_dataloader() needs setup('fit') to run first.")
        loader = self._loader(self.train_dataset, train=True)
        self.resume.apply(loader, self.trainer)
        self._train_loader = loader
        return loader

    @override
    def val_dataloader(self) -> DataLoader | list:
        """The validation loader, or ``[]`` when there is no validation set."""
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, train=False)

    @override
    def test_dataloader(self) -> DataLoader:
        """The test loader: the validation transforms, in order, every sample exactly once over all ranks.

        Raises:
            ValueError: If this DataModule was given no test set (naming the argument that gives one).
        """
        if self.test_dataset is None:
            raise InvalidValueError(
                f"{type(self).__name__} has no test set: pass {self.test_argument}=... (the same layout as the "
                "training data), then trainer.test(model, datamodule=dm)."
            )
        return self._loader(self.test_dataset, train=False)

    @override
    def predict_dataloader(self) -> DataLoader:
        """The prediction loader: ``(images, indices)`` batches, each image once over all ranks, in order.

        ``predict_path(i)`` names image ``i``; the validation transforms.

        Raises:
            ValueError: If this DataModule was given no ``predict_root``.
        """
        if self.predict_dataset is None:
            raise InvalidValueError(
                f"{type(self).__name__} has nothing to predict on: pass predict_root=... (a folder of images, flat or "
                "nested; a bucket prefix; or a .txt file of image paths), then trainer.predict(model, datamodule=dm)."
            )
        return self._loader(self.predict_dataset, train=False, labelled=False)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Every rank's train-loader state, gathered (:meth:`.LoaderResume.save`)."""
        trainer = self.trainer
        return self.resume.save(self._train_loader, interrupted=trainer is not None and trainer.interrupted)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep this rank's loader state until :meth:`train_dataloader` makes the loader.

        See :class:`~lightning_fastdata.datamodules.resume.LoaderResume`.

        A checkpoint from another world size, ``num_workers`` or ``batch_size`` continues its epoch with the samples
        no rank consumed, split over this run's ranks (elastic); one that lacks some rank's state (saved by one rank
        on an exception) restarts the interrupted epoch from its beginning on every rank, with a warning.
        """
        world_size, rank = world_of(self.trainer)[:2]
        self.resume.load(state_dict, world_size, rank)

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Report corrupt images skipped in the epoch that just ended (``on_corrupt='skip'``)."""
        self.skips.batch_seen(self.trainer, self.train_dataset)
        return batch

    @override
    def teardown(self, stage: str) -> None:
        """Report skipped images of the last epoch."""
        self.skips.close(self.train_dataset)

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``; a ``DeviceBatch``'s keys, an ``EncodedBatch``'s bytes stay on the host.

        Any other batch moves as Lightning moves it; the prefetcher moves ours the same way (their ``to``).
        """
        moved = self.transfer.moved(batch, device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx) if moved is None else moved

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Convert the uint8 images of ``(images, labels, ...)`` to normalised float on the device.

        A training batch that carries its keys (a ``DeviceBatch``: ``device_transforms``/``batch_transforms``
        given) is augmented here first and returned as ``(images, targets)``; the augmentation draws its
        parameters from the keys, which :meth:`transfer_batch_to_device` left on the host. A training batch's host
        time here is added to ``transfer.train_hook_s`` (what ``DataWaitMonitor``'s verdict names).
        """
        trainer = self.trainer
        if trainer is None or not trainer.training:
            return self._after_transfer(batch)
        start = time.perf_counter()
        out = self._after_transfer(batch)
        self.transfer.train_hook_s += time.perf_counter() - start
        return out

    def _after_transfer(self, batch: Any) -> Any:
        """The device side of a batch (:meth:`on_after_batch_transfer`); a subclass adds its own here."""
        return self.transfer.after_transfer(batch, getattr(self, "num_classes", None), self._corrupt_on_device)

    def _corrupt_on_device(self, row: int, index: int, err: OSError) -> None:
        """An image the device decode found corrupt: raised, or skipped and counted by the dataset being read."""
        splits = (self.train_dataset, self.val_dataset, self.test_dataset, self.predict_dataset)
        self.skips.on_device(self.trainer, splits, index, err)

    def configure_transfer(
        self,
        prefetch: bool | None = None,
        pin_memory: bool | None = None,
        num_workers: int | Literal["auto"] | None = None,
        channels_last: bool | None = None,
        prefetch_device: torch.device | str | None = None,
        device_half: DeviceHalf | None = None,
    ) -> dict[str, str]:
        """Take the transfer settings a callback offers (``FastDataCallback`` calls this in its ``setup``).

        Call before the loaders are built; a value given to the DataModule always wins. The arguments and what it
        returns (whose value each setting uses): :meth:`~lightning_fastdata.datamodules.transfer.DeviceTransfer.offer`.
        """
        return self.transfer.offer(prefetch, pin_memory, num_workers, channels_last, prefetch_device, device_half)

    # -- loaders ----------------------------------------------------------------------------------------
    def _sampling_settings(self, dataset: Dataset, train: bool) -> SamplingSettings:
        """The sampling settings ``dataset``'s loader draws with: this module's (a mix adds its sources' weights)."""
        return self.sampling

    def _sampling_of(self, dataset: Dataset, train: bool) -> tuple[Subset | None, EpochDraws | None]:
        """The subset and (training) draws of ``dataset`` under the sampling settings; ``(None, None)``: plain."""
        return self.loaders.sampling_of(self._sampling_settings(dataset, train), dataset, self.data_classes, train)

    def _loader(self, dataset: Dataset, train: bool, labelled: bool = True, label_map: np.ndarray | None = None) -> Any:
        """The loader of ``dataset`` (:meth:`LoaderFactory.build`), with its subset and draws.

        ``labelled=False`` (predict): no subset, no label mapped. ``label_map``: the labels in another class list
        (a mix's source), where no subset maps them.
        """
        sampling = self._sampling_of(dataset, train) if labelled else (None, None)
        return self.loaders.build(
            dataset, self.trainer, train, sampling, return_keys=bool(self.transfer.device_augment),
            label_map=label_map, predicting=not labelled,
        )  # fmt: skip
