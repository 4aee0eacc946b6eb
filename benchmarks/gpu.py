"""GPU suite: how fast each DataModule feeds a model on this machine's GPU, and what each mechanism buys.

``scripts/gpu-check.sh`` runs it after staging, building and generating the data; by hand::

    python -m benchmarks.gpu --root DATA --json benchmarks/results/gpu.json [--parts fed,scale]

Parts (each adds its key to the JSON file, so a long check can be split over several runs):

- ``fed``: the rate a loader must feed (the model on device-resident synthetic batches), then the same model
  through ``Trainer.fit`` fed by each DataModule with ``FastDataCallback``, and by the torchvision baseline.
  Each row: ``img_s`` over epochs 1.. (epoch 0 warms up workers, cuDNN autotuning and the page cache),
  ``data_wait`` from our monitor, ``gpu_idle`` from CUDA events, and per epoch ``gpu_mem_mb`` (reserved),
  ``gpu_alloc_mb`` and ``host_rss_mb`` (the training process); ``steady_img_s`` is the rate within epochs and
  ``epoch_boundary_ms`` the GPU time between one epoch's last step and the next one's first (the workers refill
  their queue then: with the suite's short epochs it is a large share of ``img_s``'s wall time, in a real
  epoch of thousands of steps a small one).
- ``mechanisms``: the tensor cache (augment in workers) with the defaults (pinned, normalise on the GPU,
  channels-last, Lightning's copy), then one switched at a time: side-stream prefetch on, pinned memory off,
  normalise on the host, channels-last off.
- ``correctness``: batches through the side-stream prefetch compared bit for bit with the plain path.
- ``decode``: nvJPEG batch decode (+ random-resized crop: per image, and batched in one ``roi_align``) on the GPU
  vs our CPU path with the same workers.
- ``recipe``: torchvision's reference recipe (the shipped ``recipe_torchvision``: 176 px, TrivialAugmentWide on the
  device, RandomErasing, MixUp/CutMix, repeated augmentation) through the folder module: the model's rate on
  device-resident batches of that size, the fed rate and its ratio (``--steps``: ImageNet-length epochs need >= 500),
  torchvision's reference loader of the recipe fed to the same model (``--reference-epochs``), the variants
  (``--recipe-variants``), an untimed diagnose fit (the op recorder and the profiler; ``--no-recipe-diagnose``),
  and the device augmentation's cost per batch (policy, normalise, erase, mix), CUDA-event timed; a summary table
  at the end (:mod:`benchmarks.gpu_recipe`).
- ``device-decode``: JPEGs decoded by nvJPEG on the GPU (``decode_on="device"``) against the workers' decode, fed to
  the model, on large quality-95 photos (``--large-root``): :mod:`benchmarks.gpu_decode`.
- ``scale``: our folder module vs the torchvision baseline at 1, 2, 4, 8, 15 workers, next to the decode ceiling,
  each timed in its steady state within one pass (ours counted on the GPU, normalised, where there is one).

What the two wait figures measure: ``data_wait`` is host time (the monitor does not synchronise the GPU): from the
end of one ``training_step`` call to the start of the next, i.e. fetching and transferring the batch while the
GPU may still run queued work. ``gpu_idle`` is GPU time: the gaps between one step's last kernel and the next
step's first, measured by CUDA events on the training stream, over gaps + steps. When the GPU is the limit the
host runs ahead, so ``data_wait`` can be large while ``gpu_idle`` stays near 0; the GPU figure is the one that says
whether it starves.

On a machine without a GPU every part runs on the CPU (``--quick`` sizes keep it to about a minute) and the JSON
says ``"device": "cpu"``; the GPU-only measurements are recorded as skipped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from benchmarks.gpu_decode import device_decode
from benchmarks.gpu_fit import (
    BaselineData,
    HostNormaliseCache,
    Settings,
    SyntheticData,
    common_args,
    cuda_available,
    fit,
)
from benchmarks.gpu_recipe import VARIANTS, check_variants, recipe
from lightning_fastdata import (
    FastDataCallback,
    HDF5DataModule,
    ImageFolderDataModule,
    TensorCacheDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.loading.index.files import scan_image_folder
from lightning_fastdata.measure import (
    baseline_loader,
    count_images,
    decode_ceiling,
    ours_module,
    steady_rate,
    time_loader,
)

__all__ = ["PARTS", "Settings", "main", "run_parts"]  # Settings lives in gpu_fit, with the fit it configures

PARTS = ("fed", "mechanisms", "correctness", "decode", "recipe", "scale", "device-decode")


def _folder(s: Settings) -> dict[str, Any]:
    """The folder module's arguments: the plain decode, the same in every run (no entropy index from a cache)."""
    return dict(common_args(s), entropy_index=False)


def _cache(s: Settings, augment_on: str = "workers", cls: type = TensorCacheDataModule) -> TensorCacheDataModule:
    cache_dir = str(Path(s.scratch) / f"cache{s.cache_size}")
    return cls(
        s.root,
        cache_dir,
        cache_size=s.cache_size,
        augment_on=augment_on,
        build_processes=os.cpu_count(),
        **common_args(s),
    )


def _hdf5(s: Settings) -> HDF5DataModule:
    path = Path(s.scratch) / f"raw{s.cache_size}.h5"
    if not path.exists():
        convert_folder_to_hdf5(s.root, path, mode="raw", size=s.cache_size, processes=os.cpu_count(), progress=False)
    return HDF5DataModule(str(path), **common_args(s))


def fed(s: Settings) -> list[dict[str, Any]]:
    """The synthetic rate, then one row per loader (see the module docstring)."""
    num_classes = len(BaselineData(s).classes)
    synthetic = fit(s, SyntheticData(s, num_classes), DataWaitMonitor(print_summary=False))["img_s"]
    loaders: list[tuple[str, Any, pl.Callback | None]] = [
        ("torchvision ImageFolder (baseline)", lambda: BaselineData(s), DataWaitMonitor(print_summary=False)),
        ("ImageFolderDataModule", lambda: ImageFolderDataModule(s.root, **_folder(s)), None),
        ("TensorCacheDataModule raw, augment in workers", lambda: _cache(s, "workers"), None),
        ("TensorCacheDataModule raw, augment on device", lambda: _cache(s, "device"), None),
        ("HDF5DataModule raw", lambda: _hdf5(s), None),
    ]
    loaders = [x for x in loaders if not s.fed_loaders or x[0] in s.fed_loaders]
    for w in s.folder_workers:  # the folder module with fewer workers: cores left to the training process
        folder = dict(_folder(s), num_workers=w)
        loaders.append(
            (f"ImageFolderDataModule, {w} workers", lambda f=folder: ImageFolderDataModule(s.root, **f), None)
        )
    rows = [{"loader": "synthetic (device-resident)", "img_s": synthetic, "synthetic_img_s": synthetic}]
    for name, make, callback in loaders:
        row = fit(s, make(), callback or FastDataCallback(print_summary=False))
        rows.append({"loader": name, **row, "synthetic_img_s": synthetic, "fed_ratio": row["img_s"] / synthetic})
        print(
            f"gpu-check fed: {name}: {row['img_s']:.0f} img/s ({row['img_s'] / synthetic:.2f} of synthetic), "
            f"within epochs {row['steady_img_s']} img/s"
        )
    return rows


def mechanisms(s: Settings) -> list[dict[str, Any]]:
    """The tensor cache with the defaults, then one mechanism switched; ``repeats`` interleaved rounds."""
    variants: list[tuple[str, Any, Any, bool]] = [
        ("defaults", lambda: _cache(s), lambda: FastDataCallback(print_summary=False), True),
        (
            "side-stream prefetch on",
            lambda: _cache(s),
            lambda: FastDataCallback(prefetch=True, print_summary=False),
            True,
        ),
        (
            "pageable memory (pin_memory=False)",
            lambda: _cache(s),
            lambda: FastDataCallback(pin_memory=False, print_summary=False),
            True,
        ),
        (
            "normalise on the host (float32 over PCIe)",
            lambda: _cache(s, cls=HostNormaliseCache),
            lambda: FastDataCallback(print_summary=False),
            True,
        ),
        (
            "contiguous NCHW (channels_last off)",
            lambda: _cache(s),
            lambda: FastDataCallback(channels_last=False, print_summary=False),
            False,
        ),
    ]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in variants}
    for _ in range(s.repeats):
        for name, make, callback, channels_last in variants:
            runs[name].append(fit(s, make(), callback(), channels_last=channels_last))
            print(f"gpu-check mechanisms: {name}: {runs[name][-1]['img_s']:.0f} img/s")
    base = sorted(r["img_s"] for r in runs["defaults"])[len(runs["defaults"]) // 2]
    rows = []
    for name, rs in runs.items():
        rate = sorted(r["img_s"] for r in rs)[len(rs) // 2]
        rows.append({"variant": name, "img_s": rate, "vs_defaults": rate / base, "runs": rs})
    return rows


def correctness(s: Settings) -> dict[str, Any]:
    """The first batches through the prefetching loader (to the GPU) equal the plain loader's, bit for bit."""
    device = "cuda" if cuda_available() else "cpu"
    out: dict[str, Any] = {"device": device}
    makers: list[tuple[str, Any]] = [
        ("ImageFolderDataModule", lambda: ImageFolderDataModule(s.root, **_folder(s))),
        ("TensorCacheDataModule raw, augment in workers", lambda: _cache(s, "workers")),
        ("TensorCacheDataModule raw, augment on device", lambda: _cache(s, "device")),
    ]
    for name, make in makers:
        plain, fetched = make(), make()
        fetched.configure_transfer(prefetch=True, prefetch_device=device)
        plain.setup("fit")
        fetched.setup("fit")
        equal, n = True, 0
        for a, b in zip(plain.train_dataloader(), fetched.train_dataloader()):
            equal &= type(a) is type(b) and all(
                x is y is None or (torch.equal(x, y.cpu()) and y.device.type == device) for x, y in zip(a, b)
            )
            n += 1
            if n == 3:
                break
        out[name] = {"batches": n, "bit_identical": bool(equal)}
    return out


def decode(s: Settings) -> dict[str, Any]:
    """Batch decode with nvJPEG (+ random-resized crop and flip) on the GPU vs our CPU path's loader rate."""
    dm = ImageFolderDataModule(s.root, **_folder(s))
    dm.setup("fit")
    cpu_rate = time_loader(dm.train_dataloader, count_images, min_seconds=s.loader_seconds)
    out: dict[str, Any] = {"cpu_path_img_s": round(cpu_rate, 1), "workers": s.workers}
    if not cuda_available():
        return {**out, "gpu": "skipped: no CUDA device"}
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    files = sorted(str(p) for p in Path(s.root).rglob("*.jpg"))[: s.decode_images]
    data = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    crop = v2.Compose([v2.RandomResizedCrop(s.image_size, antialias=True), v2.RandomHorizontalFlip()])

    def batched_crop(images: list[torch.Tensor]) -> torch.Tensor:
        """Random-resized crop + flip of the whole batch in one ``roi_align`` (bilinear, no antialias)."""
        from torchvision.ops import roi_align
        from torchvision.transforms import RandomResizedCrop

        h, w = max(im.shape[1] for im in images), max(im.shape[2] for im in images)
        padded = torch.zeros((len(images), 3, h, w), dtype=torch.uint8, device="cuda")
        boxes = []
        for i, im in enumerate(images):
            padded[i, :, : im.shape[1], : im.shape[2]] = im
            top, left, ch, cw = RandomResizedCrop.get_params(im, (0.08, 1.0), (3 / 4, 4 / 3))
            boxes.append((i, left, top, left + cw, top + ch))
        rois = torch.tensor(boxes, dtype=torch.float32).to("cuda", non_blocking=True)
        out = roi_align(padded.float(), rois, s.image_size, spatial_scale=1.0, sampling_ratio=2, aligned=True)
        flip = torch.rand(len(images), device="cuda") < 0.5
        return torch.where(flip.view(-1, 1, 1, 1), out.flip(-1), out)

    def rate(crop_with: Any) -> float:
        decode_jpeg(data[: s.batch_size], device="cuda")  # warm-up: nvJPEG handles, allocator
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(0, len(data), s.batch_size):
            images = decode_jpeg(data[i : i + s.batch_size], device="cuda")
            if crop_with is not None:
                crop_with(images)
        torch.cuda.synchronize()
        return len(data) / (time.perf_counter() - start)

    gpu_decode = rate(None)
    gpu_crop = rate(lambda images: torch.stack([crop(im) for im in images]))
    gpu_batched = rate(batched_crop)
    return {
        **out,
        "gpu_decode_img_s": round(gpu_decode, 1),
        "gpu_decode_crop_img_s": round(gpu_crop, 1),
        "gpu_decode_batched_crop_img_s": round(gpu_batched, 1),
        "gpu_vs_cpu_path": round(max(gpu_crop, gpu_batched) / cpu_rate, 2),
        "note": "GPU rates exclude reading the files (bytes in memory) and run in the training process, on the GPU "
        "the model needs: a step-bound model loses that GPU time. The per-image crop is torchvision v2 "
        "RandomResizedCrop (antialiased); the batched crop is one roi_align over the padded batch (no antialias).",
    }


def _ours_consumer(dm: ImageFolderDataModule) -> Any:
    """What a training step does with our batch: on a GPU, copy the uint8 batch there and normalise there."""
    if not cuda_available():
        return count_images  # uint8 batches; a CPU-only step would normalise them (the baseline's workers do)

    def consume(batch: Any) -> int:
        images, labels = batch[0].to("cuda", non_blocking=True), batch[1]
        dm.on_after_batch_transfer((images, labels), 0)
        torch.cuda.synchronize()
        return len(labels)

    return consume


def scale(s: Settings) -> list[dict[str, Any]]:
    """Steady-state loader rates at each worker count, with the full-decode ceiling of that many cores.

    Timed inside one pass after the queue has filled (:func:`~lightning_fastdata.measure.steady_rate`): whole
    passes over a small folder with 15 workers time mostly each pass's start. Ours is counted once its batch is
    on the GPU and normalised there (what training does); the baseline's float batches are counted as they leave
    the loader (its normalise runs in its workers), so the comparison does not favour us.
    """
    files = sorted(str(p) for p in Path(s.scale_root).rglob("*.jpg"))[:200]
    ceiling = max(decode_ceiling(files).values())
    torch.set_num_threads(os.cpu_count() or 1)  # decode_ceiling pinned this process to one thread
    rows = []
    for w in s.scale_workers:
        skip = 2 + 2 * w  # warm-up + what the workers queued (prefetch_factor 2) before the clock starts
        base = steady_rate(partial(baseline_loader, s.scale_root, s.image_size, s.batch_size, w), count_images, skip)
        dm = ours_module(s.scale_root, s.image_size, s.batch_size, w)
        ours = steady_rate(dm.train_dataloader, _ours_consumer(dm), skip)
        rows.append(
            {
                "workers": w,
                "baseline_img_s": round(base, 1),
                "ours_img_s": round(ours, 1),
                "vs_baseline": round(ours / base, 2),
                "decode_ceiling_img_s": round(ceiling * w, 1),
                "ours_vs_ceiling": round(ours / (ceiling * w), 2),
                "ours_counted": "on the GPU, normalised" if cuda_available() else "uint8, leaving the loader",
            }
        )
        print(f"gpu-check scale: {w} workers: baseline {base:.0f}, ours {ours:.0f} img/s (ceiling {ceiling * w:.0f})")
    return rows


def _header(s: Settings) -> dict[str, Any]:
    import torchvision

    return {
        "device": torch.cuda.get_device_name(0) if cuda_available() else "cpu",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "settings": asdict(s),
    }


def run_parts(s: Settings, parts: list[str], json_path: str | None) -> dict[str, Any]:
    """Run ``parts`` and merge their results into ``json_path`` (a part run again replaces its old result)."""
    result: dict[str, Any] = {}
    if json_path and Path(json_path).exists():
        result = json.loads(Path(json_path).read_text())
    jobs = {
        "fed": fed,
        "mechanisms": mechanisms,
        "correctness": correctness,
        "decode": decode,
        "recipe": recipe,
        "scale": scale,
        "device-decode": device_decode,
    }
    for part in parts:
        started = time.perf_counter()
        header = _header(s)
        if part == "fed" or "date" not in result:  # the top-level header is the fed table's (the docs' GPU date)
            result.update(header)
        result.setdefault("part_settings", {})[part] = header  # each part's own date, device, settings
        result[part] = jobs[part](s)
        result.setdefault("seconds", {})[part] = round(time.perf_counter() - started, 1)
        if json_path:
            # after each part: a run stopped at its time limit keeps what it measured
            atomic_write_text(json_path, json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.gpu``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="the image folder to train from")
    p.add_argument("--scale-root", default=None, help="another folder for the scale part (default: --root)")
    p.add_argument("--large-root", default=None, help="device-decode part: a folder of large photos (default: --root)")
    p.add_argument("--scratch", required=True, help="folder for the tensor cache and the HDF5 file")
    p.add_argument("--json", default=None, help="merge the results into this JSON file")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)}")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the suite itself (CPU, CI)")
    p.add_argument("--workers", type=int, default=None, help="loader workers (default: CPUs - 1)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds of the mechanisms part")
    p.add_argument("--fed-loaders", default="", help="the fed part's loaders by name, ';'-separated (default: all)")
    p.add_argument("--folder-workers", default="", help="fed part: also the folder module at these worker counts")
    p.add_argument("--scale-workers", default="", help="worker counts of the scale part (default 1,2,4,8,15)")
    p.add_argument(
        "--recipe-variants",
        default="",
        help=f"recipe part: also the recipe less one piece each, comma-separated from {','.join(VARIANTS)}",
    )
    p.add_argument("--reference-epochs", type=int, default=None, help="recipe part: the reference loader's epochs")
    p.add_argument(
        "--no-recipe-diagnose", action="store_true", help="recipe part: skip the untimed recorder/profiler fit"
    )
    p.add_argument("--steps", type=int, default=None, help=f"training steps per epoch (default {Settings.steps})")
    p.add_argument("--epochs", type=int, default=None, help=f"epochs a fit, first untimed (default {Settings.epochs})")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    s = Settings(args.root, args.scratch, args.scale_root or args.root, workers=workers, repeats=args.repeats)
    s.large_root = args.large_root
    s.scale_workers = tuple(w for w in (1, 2, 4, 8, 15) if w <= workers) or (workers,)
    if args.scale_workers:
        s.scale_workers = tuple(int(w) for w in args.scale_workers.split(","))
    s.fed_loaders = tuple(x.strip() for x in args.fed_loaders.split(";") if x.strip())
    s.folder_workers = tuple(int(w) for w in args.folder_workers.split(",") if w)
    try:  # before any part runs
        s.recipe_variants = check_variants(tuple(v for v in args.recipe_variants.split(",") if v))
    except ValueError as err:
        p.error(f"--recipe-variants: {err}")
    if args.quick:
        s.arch, s.image_size, s.batch_size, s.steps, s.epochs, s.cache_size = "resnet18", 32, 8, 2, 2, 40
        s.scale_workers, s.decode_images, s.loader_seconds = (1,), 32, 0.5
    s.steps, s.epochs = args.steps or s.steps, args.epochs or s.epochs
    s.reference_epochs, s.recipe_diagnose = args.reference_epochs, not args.no_recipe_diagnose
    if s.epochs < 2 or (s.reference_epochs is not None and s.reference_epochs < 2):
        p.error(
            f"--epochs {s.epochs} / --reference-epochs {s.reference_epochs}: the first epoch is not timed; give 2+."
        )
    for root in (s.root, s.large_root) if "device-decode" in parts else (s.root,):
        files = len(scan_image_folder(root)) if root else s.steps * s.batch_size  # an epoch of the fed parts
        if files < s.steps * s.batch_size:  # the Trainer would silently run shorter epochs than asked
            p.error(
                f"--steps {s.steps} needs {s.steps * s.batch_size} training images (batch {s.batch_size}); {root} has "
                f"{files}: generate more (scripts/gpu-check.sh --images N --copies K) or ask for fewer steps."
            )
    Path(s.scratch).mkdir(parents=True, exist_ok=True)
    if not cuda_available():
        print("gpu-check: no CUDA device; running every part on the CPU (the GPU-only measurements are skipped).")
    return run_parts(s, parts, args.json)


if __name__ == "__main__":
    main()
