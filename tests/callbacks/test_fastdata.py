from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from helpers.spy import Spy
from torch.utils.data import DataLoader, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata import (
    DataWaitMonitor,
    DevicePrefetcher,
    FastDataCallback,
    ImageClassifier,
    ImageFolderDataModule,
)
from lightning_fastdata.callbacks.meter import DataWaitStats
from lightning_fastdata.testing import cpu_trainer


def folder_loader(image_folder: Path, workers: int, prefetch_to: str | None = None) -> StatefulDataLoader:
    dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=4, num_workers=workers, val_fraction=0)
    if prefetch_to is not None:
        dm.configure_transfer(prefetch=True, prefetch_device=prefetch_to)
    dm.setup("fit")
    return dm.train_dataloader()


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_order_equals_the_plain_loader(image_folder: Path, workers: int) -> None:
    plain = list(folder_loader(image_folder, workers))
    loader = folder_loader(image_folder, workers, prefetch_to="cpu")
    assert isinstance(loader, StatefulDataLoader) and loader.prefetch_device == "cpu"
    assert same(list(loader), plain)
    assert same(list(loader), plain)  # a second epoch through the same loader (same sampler epoch)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [1, 4, 9])
def test_saved_state_excludes_the_look_ahead_batch(image_folder: Path, workers: int, k: int) -> None:
    expected = list(folder_loader(image_folder, workers))  # 10 batches (39 images, batch 4)
    loader = folder_loader(image_folder, workers, prefetch_to="cpu")
    it = iter(loader)
    got = [next(it) for _ in range(k)]  # the iterator has already fetched batch k (the look-ahead)
    state = loader.state_dict()
    resumed = folder_loader(image_folder, workers)
    resumed.load_state_dict(state)
    assert same(got + list(resumed), expected)  # nothing skipped, nothing repeated


def test_prefetcher_on_cpu_is_the_identity() -> None:
    prefetcher = DevicePrefetcher("cpu")
    batch = (torch.arange(3), {"y": torch.ones(2)})
    assert prefetcher.stream is None and prefetcher.ready(prefetcher.start(batch)) is batch


@pytest.mark.timeout(240)
@pytest.mark.parametrize("channels_last", [True, False])
def test_callback_on_our_datamodule(image_folder: Path, channels_last: bool) -> None:
    dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=8, num_workers="auto", val_fraction=0.2)
    spy, cb = Spy(), FastDataCallback(prefetch=True, num_workers=0, channels_last=channels_last, log_every_n_steps=1)
    t = cpu_trainer(spy, cb)
    t.fit(ImageClassifier(num_classes=3), dm)
    assert isinstance(t.train_dataloader, StatefulDataLoader)
    assert t.train_dataloader.prefetch_device == torch.device("cpu")  # the callback's prefetch, built in
    assert t.train_dataloader.num_workers == 0  # the callback's value, because the DataModule said "auto"
    assert t.train_dataloader.pin_memory is False  # CPU: no pinning
    x = spy.batches[0][0]
    assert x.dtype == torch.float32 and x.shape == (8, 3, 16, 16)
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert "data_wait_fraction" in t.callback_metrics and "samples_per_sec" in t.callback_metrics


@pytest.mark.slow
def test_explicit_datamodule_settings_win(image_folder: Path) -> None:
    dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=8, num_workers=0, pin_memory=False)
    t = cpu_trainer(FastDataCallback(num_workers=3, pin_memory=True))
    t.fit(ImageClassifier(num_classes=3), dm)
    assert t.train_dataloader.num_workers == 0 and t.train_dataloader.pin_memory is False
    assert getattr(t.train_dataloader, "prefetch_device", None) is None  # prefetch is off by default
    # The one hand-over point says whose value is used.
    fresh = ImageFolderDataModule(str(image_folder), image_size=16, num_workers=0)
    assert fresh.configure_transfer(prefetch=True, pin_memory=True, num_workers=3)["num_workers"] == "DataModule"
    assert fresh.configure_transfer(pin_memory=True)["pin_memory"] == "callback"
    assert fresh.transfer.use_pin_memory(trainer=None) is True


class LoaderSubclass(DataLoader):
    pass


class SubclassDataModule(pl.LightningDataModule):
    def train_dataloader(self) -> Any:
        return LoaderSubclass(TensorDataset(torch.randn(10, 3, 8, 8), torch.randint(0, 3, (10,))), batch_size=5)


@pytest.mark.timeout(120)
def test_callback_uses_a_foreign_loader_subclass_as_it_is() -> None:
    t = cpu_trainer(FastDataCallback())
    with pytest.warns(UserWarning, match="LoaderSubclass is a DataLoader subclass this callback cannot rebuild"):
        t.fit(ImageClassifier(num_classes=3), SubclassDataModule())
    assert type(t.train_dataloader) is LoaderSubclass


class ForeignDataModule(pl.LightningDataModule):
    def __init__(self, as_list: bool = False) -> None:
        super().__init__()
        self.as_list = as_list
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(20, 3, 16, 16, generator=g), torch.randint(0, 3, (20,), generator=g))

    def train_dataloader(self) -> Any:
        loader = DataLoader(self.data, batch_size=5)
        return Batches(list(loader)) if self.as_list else loader


class Batches:
    """An iterable of batches that is not a DataLoader (Lightning accepts it)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_callback_on_a_foreign_datamodule(recwarn: pytest.WarningsRecorder) -> None:
    plain_spy, spy = Spy(), Spy()
    cpu_trainer(plain_spy).fit(ImageClassifier(num_classes=3), ForeignDataModule())
    t = cpu_trainer(spy, FastDataCallback(prefetch=True))
    t.fit(ImageClassifier(num_classes=3), ForeignDataModule())
    assert type(t.train_dataloader).__name__ == "PrefetchingDataLoader"
    assert same(spy.batches, plain_spy.batches)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_second_fit_on_a_foreign_datamodule_prefetches_again_and_leaves_it_as_it_was() -> None:
    import warnings

    dm = ForeignDataModule()
    method = type(dm).train_dataloader
    callback = FastDataCallback(prefetch=True)
    for _ in range(2):
        t = cpu_trainer(callback)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.fit(ImageClassifier(num_classes=3), dm)
        ours = [str(w.message) for w in caught if "FastDataCallback" in str(w.message)]
        assert not ours  # e.g. "cannot rebuild": the first fit's closure, met by the second
        assert type(t.train_dataloader).__name__ == "PrefetchingDataLoader"
        assert t.train_dataloader.prefetch_device == t.strategy.root_device
        assert "train_dataloader" not in vars(dm) and dm.train_dataloader.__func__ is method


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_callback_explains_what_it_cannot_do() -> None:
    with pytest.warns(UserWarning, match="returned Batches, not a DataLoader"):
        cpu_trainer(FastDataCallback()).fit(ImageClassifier(num_classes=3), ForeignDataModule(as_list=True))
    data = ForeignDataModule().train_dataloader()
    with pytest.warns(UserWarning, match="no DataModule"):
        cpu_trainer(FastDataCallback()).fit(ImageClassifier(num_classes=3), train_dataloaders=data)
    with pytest.raises(ValueError, match="num_workers"):
        FastDataCallback(num_workers=-2)


def test_monitor_counts_every_step_and_reports_runs_shorter_than_the_log_interval(
    image_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """39 images, batch 8: 5 steps per epoch, 10 in two epochs; the Trainer logs every 50 steps."""
    from lightning.pytorch.loggers import CSVLogger

    dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=8, num_workers=0, val_fraction=0)
    cb = FastDataCallback()
    t = cpu_trainer(cb, epochs=2, logger=CSVLogger(tmp_path), log_every_n_steps=50)
    with caplog.at_level(logging.INFO):
        t.fit(ImageClassifier(num_classes=3), dm)
    assert cb.monitor.meter.total().steps == 10  # every step, also each epoch's first
    rows = (Path(t.logger.log_dir) / "metrics.csv").read_text()  # type: ignore[union-attr]
    assert "data_wait_fraction" in rows and "samples_per_sec" in rows  # logged once, at the end
    assert "images/s per rank over 10 steps" in caplog.text


def test_callback_prints_its_summary_without_a_logger(image_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=8, num_workers=0, val_fraction=0)
    with caplog.at_level(logging.INFO):
        cpu_trainer(FastDataCallback(), max_steps=3).fit(ImageClassifier(num_classes=3), dm)  # logger=False
    assert "images/s per rank over 3 steps" in caplog.text and "waiting for data" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        cpu_trainer(FastDataCallback(print_summary=False), max_steps=3).fit(ImageClassifier(num_classes=3), dm)
    assert "images/s per rank" not in caplog.text


def test_input_bound_advice_points_to_the_doctor_with_the_measured_step_time() -> None:
    stats = DataWaitStats(steps=10, samples=640, wait_s=3.0, total_s=4.2)  # 120 ms of compute per step
    trainer = SimpleNamespace(datamodule=None, train_dataloader=SimpleNamespace(num_workers=2))
    advice = DataWaitMonitor().advice(stats, trainer)  # type: ignore[arg-type]
    assert "waited for data 71%" in advice and "`fastdata doctor DATA --step-ms 120`" in advice


class _ThreadsSeen(pl.Callback):
    """Torch's intra-op thread count at each training step, and whether a step should raise."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.seen: list[int] = []
        self.fail_at = fail_at

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        self.seen.append(torch.get_num_threads())
        if self.fail_at is not None and i == self.fail_at:
            raise RuntimeError("stopped on purpose")


@pytest.mark.timeout(180)
def test_host_threads_sets_torchs_threads_while_training_and_puts_them_back(image_folder: Path) -> None:
    """An explicit ``host_threads`` holds for every training step (with real loader workers), then the old count is
    back, also after a fit that raised; ``"auto"`` on a CPU run leaves torch's count (the model trains on it)."""
    before = torch.get_num_threads()
    target = 1 if before > 1 else 2
    try:
        for fail_at in (None, 1):
            dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=8, num_workers=1, val_fraction=0)
            seen = _ThreadsSeen(fail_at)
            t = cpu_trainer(seen, FastDataCallback(host_threads=target), max_steps=3)
            if fail_at is None:
                t.fit(ImageClassifier(num_classes=3), dm)
            else:
                with pytest.raises(RuntimeError, match="stopped on purpose"):
                    t.fit(ImageClassifier(num_classes=3), dm)
            assert seen.seen and set(seen.seen) == {target}
            assert torch.get_num_threads() == before
        dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=8, num_workers=1, val_fraction=0)
        seen, cb = _ThreadsSeen(), FastDataCallback()
        t = cpu_trainer(seen, cb, max_steps=2)
        t.fit(ImageClassifier(num_classes=3), dm)
        assert cb.host_threads == "auto" and cb.host_thread_count(t) is None and set(seen.seen) == {before}
    finally:
        torch.set_num_threads(before)


def test_host_threads_auto_gives_torch_the_cpus_the_workers_leave() -> None:
    """The ``"auto"`` count on an accelerator: usable CPUs per device less the workers, at least one."""
    from lightning_fastdata.callbacks.fastdata import threads_beside_workers
    from lightning_fastdata.loading.workers import CpuBudget

    assert threads_beside_workers(15, 1, CpuBudget(affinity=16)) == 1  # the H100 machine: 16 CPUs, 15 workers
    assert threads_beside_workers(8, 1, CpuBudget(affinity=16)) == 8
    assert threads_beside_workers(6, 2, CpuBudget(affinity=16)) == 2  # two ranks share the node
    assert threads_beside_workers(15, 1, CpuBudget(affinity=64, quota=12.5)) == 1  # the cgroup quota counts
    assert threads_beside_workers(3, 1, CpuBudget(affinity=2)) == 1
    for bad in (0, -1, 1.5, "all", True):
        with pytest.raises(ValueError, match="host_threads"):
            FastDataCallback(host_threads=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(240)
def test_the_device_half_runs_static_with_the_eager_pixels_and_graphed_only_on_cuda(image_folder: Path) -> None:
    """``FastDataCallback(device_half=...)`` puts the static device half where the DataModule's eager one stood:
    trained on, it gives the eager half's images and soft targets bit for bit; ``"graphed"`` captures CUDA graphs,
    so on the CPU the eager half runs; a transform without a static form is refused at setup, named."""
    from torchvision.transforms import v2

    from lightning_fastdata.augment import ColorJitter, RandomErasing, TrivialAugmentWide
    from lightning_fastdata.augment.graphed.half import StaticDeviceHalf
    from lightning_fastdata.augment.pipeline import DeviceAugment

    def fit(half: Any, device_transforms: Any = None) -> tuple[list[Any], Any]:
        dm = ImageFolderDataModule(
            str(image_folder), image_size=16, batch_size=8, num_workers=0, val_fraction=0.0, seed=3,
            device_transforms=device_transforms or TrivialAugmentWide(),
            batch_transforms=[RandomErasing(0.5), v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])],
        )  # fmt: skip
        spy = Spy()
        cpu_trainer(spy, FastDataCallback(device_half=half), epochs=-1, max_steps=4).fit(ImageClassifier(3), dm)
        return spy.batches, dm.transfer.device_augment

    (eager, eager_half), (static, static_half), (graphed, graphed_half) = (
        fit(h) for h in ("eager", "static", "graphed")
    )
    assert type(eager_half) is DeviceAugment and type(graphed_half) is DeviceAugment  # CPU: eager
    assert type(static_half) is StaticDeviceHalf
    assert len(eager) == 4
    for a, b, c in zip(eager, static, graphed, strict=True):
        assert a[1].dtype == torch.float32 and a[1].ndim == 2  # soft targets: the mixing ran
        assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a, b, c, strict=True))
    with pytest.raises(ValueError, match=r"device_half='static' .*ColorJitter.*leave device_half='eager'"):
        fit("static", ColorJitter(0.4))
    with pytest.raises(ValueError, match="device_half should be"):
        FastDataCallback(device_half="captured")  # type: ignore[arg-type]
