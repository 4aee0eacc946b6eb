"""The GPU suite's ``device-decode`` part: JPEGs decoded on the GPU (``decode_on="device"``) against the workers'.

On ``--large-root`` (large quality-95 photos, where the workers' decode limits every module; ``scripts/gpu-check.sh``
generates 1000x750 q95 ones) or, without it, ``--root``, in one run:

- the loader alone, its batches leaving it: the workers decoding (``decode_on="workers"``) and the workers only
  planning (``"device"``: header, crop, bytes), what the device decode can be fed at most from these CPUs;
- on a GPU: the device decode of a batch (nvJPEG, crop, resize, flip; CUDA-event and host timed), its pixels
  against libjpeg-turbo's decode of the same batch and against the workers' exact path (PSNR, dB); then the model
  trained on device-resident batches (the rate to feed), and fed by the folder module each way: ``img_s``, the fed
  ratio, the device hook's host ms per step, and ``device_vs_workers`` (the issue's target: >= 1.5 on large photos).

Without a GPU the loader rates are measured and the rest recorded as skipped.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from benchmarks.gpu_fit import BaselineData, Settings, SyntheticData, common_args, cuda_available, fit
from lightning_fastdata import FastDataCallback, ImageFolderDataModule
from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.datasets.base import LoaderPlan
from lightning_fastdata.loading.batch import EncodedBatch
from lightning_fastdata.loading.jpeg.device import decode_encoded
from lightning_fastdata.measure import count_images, time_loader

__all__ = ["device_decode"]


def _module(s: Settings, root: str, decode_on: str) -> ImageFolderDataModule:
    return ImageFolderDataModule(root, **common_args(s), entropy_index=False, decode_on=decode_on)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Peak signal-to-noise ratio of two uint8 batches, in dB (``inf``: the same)."""
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else round(10 * math.log10(255**2 / mse), 2)


def device_decode(s: Settings) -> dict[str, Any]:
    """The folder's row (module docstring)."""
    name, root = ("large", s.large_root) if s.large_root else ("main", s.root)
    out = {"set": name, "root": root, "workers": s.workers, "image_size": s.image_size, "batch_size": s.batch_size}
    out.update(_measure(s, root))
    print(f"gpu-check device-decode: {out}")
    return out


def _measure(s: Settings, root: str) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for decode_on in ("workers", "device"):
        dm = _module(s, root, decode_on)
        dm.setup("fit")
        row[f"loader_{decode_on}_img_s"] = round(
            time_loader(dm.train_dataloader, count_images, min_seconds=s.loader_seconds), 1
        )
    if not cuda_available():
        return {**row, "gpu": "skipped: no CUDA device"}
    row.update(_decode_alone(s, root))
    synthetic = fit(s, SyntheticData(s, len(BaselineData(s).classes)), DataWaitMonitor(print_summary=False))["img_s"]
    row["synthetic_img_s"] = synthetic
    for decode_on in ("workers", "device"):
        dm = _module(s, root, decode_on)
        fed = fit(s, dm, FastDataCallback(print_summary=False))
        fed["fed_ratio"] = round(fed["img_s"] / synthetic, 3)
        fed["hook_ms_per_step"] = round(1000 * dm.transfer.train_hook_s / max(1, s.epochs * s.steps), 2)
        row[f"fed_{decode_on}"] = fed
    row["device_vs_workers"] = round(row["fed_device"]["img_s"] / row["fed_workers"]["img_s"], 2)
    return row


def _decode_alone(s: Settings, root: str, batches: int = 8) -> dict[str, Any]:
    """The device decode of ``batches`` planned batches: GPU and host ms per batch, and PSNRs of the first."""
    dm = _module(s, root, "device")
    dm.setup("fit")
    planned: list[EncodedBatch] = []
    for batch in dm.train_dataloader():
        planned.append(batch)
        if len(planned) == batches:
            break
    on_gpu = [b.to("cuda") for b in planned]
    decode_encoded(on_gpu[0])  # warm-up: nvJPEG's handles, the allocator
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for b in on_gpu:
        decode_encoded(b)
    end.record()
    host_ms = 1000 * (time.perf_counter() - host) / len(on_gpu)
    torch.cuda.synchronize()
    first = planned[0]
    gpu_pixels = decode_encoded(on_gpu[0])[0].cpu()
    reference = dm.train_dataset.for_loader(LoaderPlan())  # type: ignore[union-attr]
    reference.exact_decode = True
    keys = first.keys if first.keys is not None else [(0, int(i), 0) for i in first.indices]
    return {
        "decode_gpu_ms_per_batch": round(start.elapsed_time(end) / len(on_gpu), 2),
        "decode_host_ms_per_batch": round(host_ms, 2),
        "decode_img_s": round(1000 * len(first.labels) / max(start.elapsed_time(end) / len(on_gpu), 1e-6), 1),
        "psnr_vs_libjpeg_db": psnr(gpu_pixels, decode_encoded(first)[0]),
        "psnr_vs_workers_exact_db": psnr(gpu_pixels, reference.__getitems__(keys)[0]),
    }
