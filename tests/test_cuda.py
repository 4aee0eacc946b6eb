"""What runs only on a GPU: prefetch on a side stream, pinned transfers, the device crop, resume with prefetch.

Every test here carries the ``cuda`` mark: ``conftest.py`` skips them without a GPU (the logic each one guards also
has a CPU test), and ``pytest -m cuda`` (``scripts/gpu-check.sh``) runs exactly these on a GPU machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from helpers.spy import Spy

from lightning_fastdata import FastDataCallback, ImageClassifier, ImageFolderDataModule, TensorCacheDataModule
from lightning_fastdata.loading.batch import DeviceBatch, move_to_device

pytestmark = pytest.mark.cuda
HELPER = Path(__file__).with_name("helpers") / "resume_run.py"


def recipe_module(image_folder: Path, interpolation: str = "nearest", **kw: Any) -> ImageFolderDataModule:
    """The folder module with the recipe's device half: a policy per sample, RandomErasing, MixUp or CutMix."""
    from torchvision.transforms import v2

    from lightning_fastdata.augment import RandomErasing, TrivialAugmentWide

    return ImageFolderDataModule(
        str(image_folder),
        image_size=64,
        val_fraction=0.0,
        device_transforms=TrivialAugmentWide(interpolation=interpolation),
        batch_transforms=[RandomErasing(0.5), v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])],
        **kw,
    )


def first_batches(dm: Any, n: int, prefetch_to: str | None = None) -> list[tuple[torch.Tensor, ...]]:
    if prefetch_to is not None:
        dm.configure_transfer(prefetch=True, prefetch_device=prefetch_to)
    dm.setup("fit")
    out = []
    for batch in dm.train_dataloader():
        out.append(move_to_device(batch, "cpu") if prefetch_to is None else batch)
        if len(out) == n:
            break
    return out


@pytest.mark.timeout(300)
def test_cuda_prefetch_equals_cpu_and_keeps_reserved_memory_flat(image_folder: Path) -> None:
    def make() -> ImageFolderDataModule:
        return ImageFolderDataModule(str(image_folder), image_size=16, batch_size=4, num_workers=2, val_fraction=0)

    expected = first_batches(make(), 100)
    dm = make()
    dm.configure_transfer(prefetch=True, prefetch_device="cuda")
    dm.setup("fit")
    loader = dm.train_dataloader()
    reserved = []
    for _ in range(4):
        got = list(loader)
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        assert all(x.is_cuda and x.dtype == torch.uint8 for x, _ in got)
        assert len(got) == len(expected)
        assert all(torch.equal(x.cpu(), a) and torch.equal(y.cpu(), b) for (x, y), (a, b) in zip(got, expected))
    assert reserved[-1] == reserved[1], reserved  # flat after the first epoch: no stream or buffer per epoch


@pytest.mark.timeout(300)
@pytest.mark.parametrize("augment_on", ["workers", "device"])
def test_cuda_tensor_cache_batches_through_prefetch_are_the_plain_batches(
    image_folder: Path, tmp_path: Path, augment_on: str
) -> None:
    def make() -> TensorCacheDataModule:
        return TensorCacheDataModule(
            str(image_folder), str(tmp_path / "c"), cache_size=24, image_size=16, batch_size=8, num_workers=2,
            val_fraction=0, augment_on=augment_on, build_processes=1,
        )  # fmt: skip

    plain, fetched = first_batches(make(), 3), first_batches(make(), 3, prefetch_to="cuda")
    assert len(plain) == len(fetched) == 3
    for a, b in zip(plain, fetched):
        # a field the batch does not carry (keys, without a device policy) is None on both sides
        assert [x is None for x in a] == [y is None for y in b]
        assert all(t.is_cuda for t in b if t is not None)
        assert all(torch.equal(x, y.cpu()) for x, y in zip(a, b) if x is not None)  # bit for bit, boxes and flips
    if augment_on == "device":  # the crop itself, on the GPU vs on the CPU, from the same squares and boxes
        dm = make()
        on_cpu = dm.on_after_batch_transfer(plain[0], 0)[0]
        on_gpu = dm.on_after_batch_transfer(fetched[0], 0)[0]
        assert on_gpu.is_cuda and on_gpu.shape == on_cpu.shape == (8, 3, 16, 16)
        assert on_gpu.is_contiguous(memory_format=torch.channels_last)
        # bilinear resize in float: the two backends round differently, by far less than one uint8 level
        assert (on_gpu.cpu() - on_cpu).abs().max() < 2 / 255 / 0.224


@pytest.mark.timeout(300)
def test_cuda_fit_with_the_callback(image_folder: Path) -> None:
    dm = ImageFolderDataModule(str(image_folder), image_size=32, batch_size=8, num_workers=2)
    spy = Spy()
    t = pl.Trainer(
        max_epochs=2,
        accelerator="gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[spy, FastDataCallback(prefetch=True)],
    )
    t.fit(ImageClassifier(num_classes=3, channels_last=True), dm)
    images = spy.batches[0][0]
    assert images.is_cuda and images.dtype == torch.float32 and t.train_dataloader.pin_memory
    assert images.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.timeout(300)
def test_training_steps_with_the_recipe_never_make_the_host_wait_for_the_gpu(image_folder: Path) -> None:
    """From the end of step 1 to the end of the epoch, torch's sync debug mode raises on any call that waits for the
    GPU: the loader's batches, the prefetch, the device half of the recipe, forward, backward, the fused AdamW and
    Lightning's step, including the progress-bar values it reads as numbers after every step (``ImageClassifier``
    gives it the newest values the GPU has finished copying to the host; it used to give its device tensors: a wait
    per step)."""

    class Strict(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step >= 1:
                torch.cuda.set_sync_debug_mode("error")

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            torch.cuda.set_sync_debug_mode(0)  # the epoch's end reduces its metrics: a wait, once an epoch

    dm = recipe_module(image_folder, batch_size=8, num_workers=2)
    t = pl.Trainer(
        max_epochs=1,
        accelerator="gpu",
        devices=1,
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Strict(), FastDataCallback(prefetch=True, print_summary=False)],
    )
    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.fit(ImageClassifier(num_classes=3, channels_last=True), dm)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert not [w for w in caught if "logged with prog_bar=True" in str(w.message)]  # FastDataCallback's check
    assert t.global_step >= 3
    assert set(t.progress_bar_metrics) >= {"loss", "acc"} and "train_loss" in t.callback_metrics


@pytest.mark.timeout(300)
def test_the_prediction_writer_never_makes_the_host_wait_for_the_gpu_per_batch(
    image_folder: Path, tmp_path: Path
) -> None:
    """From the second predict batch to the epoch's end, torch's sync debug mode raises on any wait for the GPU: the
    writer copies each batch's top-k to pinned memory without waiting and reads them once, at the end."""
    from lightning_fastdata import PredictionWriter

    class Strict(pl.Callback):
        def on_predict_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            torch.cuda.set_sync_debug_mode("error")

        def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            torch.cuda.set_sync_debug_mode(0)

    dm = ImageFolderDataModule(str(image_folder), predict_root=str(image_folder), image_size=32, batch_size=8,
                               num_workers=2)  # fmt: skip
    out = tmp_path / "p.csv"
    # Strict's hooks run first (callbacks in order): its epoch end lifts the mode before the writer's one wait
    t = pl.Trainer(accelerator="gpu", devices=1, logger=False, enable_progress_bar=False,
                   callbacks=[Strict(), PredictionWriter(str(out), top_k=2)])  # fmt: skip
    try:
        t.predict(ImageClassifier(num_classes=3, multi_label=True), datamodule=dm, return_predictions=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    rows = out.read_text().splitlines()
    assert len(rows) == 1 + 39 and all(0 <= float(v) <= 1 for v in rows[1].split(",")[2::2])


@pytest.mark.timeout(300)
def test_the_captured_device_half_replays_the_eager_gpu_results_and_never_waits(image_folder: Path) -> None:
    """The recipe's device half captured as a CUDA graph: each replay (a shorter last batch padded) gives the eager
    path's images and targets on the GPU bit for bit, and after the capture no call waits for the GPU."""
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    from lightning_fastdata.augment import RandomErasing, TrivialAugmentWide
    from lightning_fastdata.augment.graphed.captured import CapturedDeviceHalf, CudaGraph
    from lightning_fastdata.augment.graphed.half import StaticDeviceHalf
    from lightning_fastdata.augment.normalize import Normalizer
    from lightning_fastdata.augment.pipeline import DeviceAugment

    files = sorted(image_folder.glob("*/*.jpg"))[:32]
    photos = torch.stack([F.center_crop(decode_jpeg(read_file(str(p))), [64, 64]) for p in files]).cuda()
    mixing = v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])
    augment = DeviceAugment([TrivialAugmentWide()], [RandomErasing(0.5), mixing], seed=3)
    captured = CapturedDeviceHalf(StaticDeviceHalf(augment), CudaGraph())
    normalize = Normalizer((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    labels = (torch.arange(32) % 3).cuda()

    def keys_of(n: int, epoch: int) -> torch.Tensor:
        return torch.stack([torch.full((n,), epoch), torch.arange(n), torch.zeros(n, dtype=torch.int64)], 1)

    captured(photos.clone(), labels, keys_of(32, 0), normalize, 3)  # the capture
    try:
        for epoch, n in ((1, 32), (2, 32), (3, 21)):
            torch.cuda.set_sync_debug_mode("error")
            got = captured(photos[:n].clone(), labels[:n], keys_of(n, epoch), normalize, 3)
            torch.cuda.set_sync_debug_mode(0)
            want = augment(photos[:n].clone(), labels[:n], keys_of(n, epoch), normalize, num_classes=3)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), epoch
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert captured.replays == 4 and captured.eager_calls == 0


@pytest.mark.timeout(300)
def test_the_callbacks_graphed_device_half_trains_on_the_eager_batches(image_folder: Path) -> None:
    """``FastDataCallback(device_half="graphed")`` on a GPU: the DataModule's device half is captured once and
    replayed for each training batch (an epoch's shorter last one padded), the model trains on the eager half's
    images and targets bit for bit."""
    from lightning_fastdata.augment.graphed.captured import CapturedDeviceHalf

    def fit(half: str) -> tuple[list[Any], Any]:
        dm = recipe_module(image_folder, batch_size=16, num_workers=2, seed=4)
        spy = Spy()
        t = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                       enable_checkpointing=False, callbacks=[spy, FastDataCallback(device_half=half)])  # fmt: skip
        t.fit(ImageClassifier(num_classes=3), dm)
        return [tuple(x.cpu() for x in b) for b in spy.batches], dm.transfer.device_augment

    (eager, _), (graphed, captured) = fit("eager"), fit("graphed")
    assert isinstance(captured, CapturedDeviceHalf) and captured.replays == len(graphed)  # each batch a replay
    assert len(eager) == len(graphed) > 2 and captured.eager_calls == 0
    for a, b in zip(eager, graphed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def run(cfg: dict[str, Any]) -> int:
    out = subprocess.run([sys.executable, str(HELPER), json.dumps(cfg)], capture_output=True, text=True, timeout=240)
    assert out.returncode in (0, -9), out.stderr[-3000:]
    return out.returncode


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(f"{path}.rank0").read_text().splitlines()]


@pytest.mark.timeout(600)
def test_cuda_sigkilled_run_with_prefetch_resumes_at_the_exact_sample(image_folder: Path, tmp_path: Path) -> None:
    """Killed at step 8 (last checkpoint at step 6), resumed: steps 6.. are those of the uninterrupted run."""
    base = {
        "kind": "folder", "source": str(image_folder), "workers": 2, "devices": 1, "accelerator": "gpu",
        "prefetch": True, "max_steps": 12, "cache_dir": str(tmp_path / "c"),
    }  # fmt: skip
    assert run({**base, "record": str(tmp_path / "full")}) == 0
    ckpts = str(tmp_path / "ck")
    killed = {**base, "record": str(tmp_path / "killed"), "save_every": 3, "ckpt_dir": ckpts, "kill_at": 8}
    assert run(killed) == -9
    assert run({**base, "record": str(tmp_path / "resumed"), "ckpt_path": f"{ckpts}/last.ckpt"}) == 0
    full, resumed = records(tmp_path / "full"), records(tmp_path / "resumed")
    killed_steps = records(tmp_path / "killed")
    assert [r["step"] for r in full] == list(range(12)) and resumed[0]["step"] == 6
    assert killed_steps[:6] + resumed == full


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return float("inf") if mse == 0 else 10 * __import__("math").log10(255**2 / mse)


@pytest.mark.timeout(300)
def test_device_policies_on_cuda_draw_what_the_cpu_draws_and_match_its_pixels(image_folder: Path) -> None:
    """The same keys give the same ops and magnitudes on the GPU (integer hashing); the integer ops give the CPU's
    (torchvision's) pixels exactly, the blends within one level, the warps within 35 dB PSNR."""
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms.v2 import functional as F

    from lightning_fastdata.augment import ColorJitter, RandAugment, RandomErasing, TrivialAugmentWide, ops
    from lightning_fastdata.augment.keyed import uniforms

    files = sorted(image_folder.glob("*/*.jpg"))[:16]
    batch = torch.stack([F.center_crop(decode_jpeg(read_file(str(p))), [64, 64]) for p in files])
    gpu = batch.cuda()
    keys = torch.stack([torch.ones(16, dtype=torch.long), torch.arange(16), torch.zeros(16, dtype=torch.long)], 1)
    assert torch.equal(uniforms(0, keys, 3, 5), uniforms(0, keys.cuda(), 3, 5).cpu())
    n = len(batch)
    exact = {
        "posterize": lambda x: ops.posterize(x, torch.arange(n) % 9),
        "solarize": lambda x: ops.solarize(x, torch.linspace(0, 255, n)),
        "autocontrast": ops.autocontrast,
        "equalize": ops.equalize,
        "erase": lambda x: ops.erase(x, torch.tensor([[1, 2, 10, 12]] * n), 0),
    }
    for name, fn in exact.items():
        assert torch.equal(fn(gpu).cpu(), fn(batch)), name
    factor = torch.linspace(0.05, 1.95, n)
    for fn in (ops.adjust_brightness, ops.adjust_saturation, ops.adjust_contrast, ops.adjust_sharpness):
        diff = (fn(gpu, factor).cpu().int() - fn(batch, factor).int()).abs()
        assert int(diff.max()) <= 1, fn.__name__
    for policy in (TrivialAugmentWide(), RandAugment(), ColorJitter(0.4, 0.4, 0.4, 0.1)):
        assert _psnr(policy(gpu, keys.cuda(), 0).cpu(), policy(batch, keys, 0)) >= 35, type(policy).__name__
    erased = RandomErasing(p=1.0)(gpu.float(), keys.cuda(), 0)
    assert torch.equal(erased.cpu(), RandomErasing(p=1.0)(batch.float(), keys, 0))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("prefetched", [False, True], ids=["transferred", "prefetched"])
def test_the_device_augmentation_of_a_training_batch_never_waits_for_the_gpu(
    image_folder: Path, prefetched: bool
) -> None:
    """With the keys left on the host by the transfer (a ``DeviceBatch``), the recipe's device half (policy,
    normalise, erase, MixUp/CutMix) queues its work without one synchronising call (torch's sync debug mode raises
    on each).

    ``prefetched`` (``FastDataCallback(prefetch=True)``): the batch reaches the hooks already on the GPU, moved by
    the prefetcher with the DataModule's own move, its keys still on the host."""
    from lightning_fastdata.loading.transport.prefetch import DevicePrefetcher

    dm = recipe_module(image_folder, batch_size=16, num_workers=0, interpolation="bilinear")
    prefetcher = DevicePrefetcher("cuda")
    cuda = torch.device("cuda")
    for batch in first_batches(dm, 3):
        assert type(batch) is DeviceBatch and batch.keys is not None
        on_gpu = dm.transfer_batch_to_device(dm.on_before_batch_transfer(batch, 0), cuda, 0)
        assert on_gpu.keys.device.type == "cpu"  # the keys stay on the host
        plain = dm.on_after_batch_transfer(on_gpu, 0)  # warm-up: allocator, kernels, pinned buffers
        if prefetched:
            on_gpu = prefetcher.ready(prefetcher.start(batch))
            assert on_gpu.images.is_cuda and on_gpu.keys.device.type == "cpu"
        else:
            on_gpu = dm.transfer_batch_to_device(dm.on_before_batch_transfer(batch, 0), cuda, 0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            if prefetched:  # Lightning's first hook is given the batch the prefetcher already moved
                dm.on_before_batch_transfer(on_gpu, 0)
            images, targets = dm.on_after_batch_transfer(on_gpu, 0)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(images, plain[0]) and torch.equal(targets, plain[1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [(96, 72), (1600, 1200)], ids=["small", "large"])
def test_nvjpeg_batches_match_the_host_decoders_crops(tmp_path: Path, size: tuple[int, int]) -> None:
    """``decode_on="device"`` on a GPU: nvJPEG's crops against libjpeg-turbo's (torchvision's host decoder) of the
    same encoded batch, and against the workers' own exact decode: a PSNR (two IDCTs and chroma upsamplings)."""
    from benchmarks.gpu_decode import psnr
    from lightning_fastdata.datasets.base import LoaderPlan
    from lightning_fastdata.demos import make_image_folder
    from lightning_fastdata.loading.batch import EncodedBatch
    from lightning_fastdata.loading.jpeg.device import decode_encoded

    root = make_image_folder(tmp_path / "train", num_classes=2, per_class=8, size=size, quality=95)
    dm = ImageFolderDataModule(str(root), image_size=176, batch_size=16, num_workers=2, val_fraction=0,
                               decode_on="device", entropy_index=False)  # fmt: skip
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, EncodedBatch) and len(batch.rendered_rows) == 0
    on_gpu, kept = decode_encoded(batch.to("cuda"))
    on_cpu, _ = decode_encoded(batch)
    assert on_gpu.is_cuda and on_gpu.shape == (16, 3, 176, 176) and bool(kept.all())
    assert psnr(on_gpu.cpu(), on_cpu) >= 35
    reference = dm.train_dataset.for_loader(LoaderPlan())  # type: ignore[union-attr]
    reference.exact_decode = True
    workers = reference.__getitems__(batch.keys if batch.keys is not None else [(0, int(i), 0) for i in batch.indices])
    assert psnr(on_gpu.cpu(), workers[0]) >= 30


@pytest.mark.timeout(300)
def test_a_fit_decodes_on_the_gpu_with_the_recipe_and_prefetch(image_folder: Path) -> None:
    dm = recipe_module(image_folder, batch_size=8, num_workers=2, decode_on="device")
    spy = Spy()
    t = pl.Trainer(max_epochs=2, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, callbacks=[spy, FastDataCallback(prefetch=True)])  # fmt: skip
    t.fit(ImageClassifier(num_classes=3, channels_last=True), dm)
    images, targets = spy.batches[0][:2]
    assert images.is_cuda and images.dtype == torch.float32 and images.shape[-2:] == (64, 64)
    assert targets.is_cuda and targets.shape == (images.shape[0], 3)  # MixUp/CutMix's soft targets
