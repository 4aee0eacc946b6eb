"""The peers on the same data, same cores, same run: DALI (CPU), SPDL and LitData beside ours and the baseline.

    python -m benchmarks.peers --json benchmarks/results/peers.json
    fastdata bench --suites peers ...   (the same rows, inside the bench's JSON)

Every loader does the same job on the same JPEG folder: a random-resized crop to 224 px (torchvision's scale
0.08-1 and ratio 3/4-4/3) and a random horizontal flip per image, batches of uint8 ``N x 3 x 224 x 224`` images
with their labels, shuffled, ``--workers`` processes or threads. Normalising to float is left to the device for
all of them (the baseline does it in its workers, as users write it). Rows, measured interleaved:

- ``baseline``: torchvision ``ImageFolder`` + its transforms + plain ``DataLoader`` (what users write today);
- ``ImageFolderDataModule (first epoch)``: ours with no entropy index yet (``entropy_index=False``);
- ``ImageFolderDataModule (epochs 2+)``: ours with the index the first epoch builds (built before timing here);
- ``DALI (CPU)``: NVIDIA DALI's CPU pipeline: ``readers.file``, ``decoders.image_random_crop`` (libjpeg-turbo,
  decoding only the crop's window), ``resize`` (linear, antialiased), ``crop_mirror_normalize`` to uint8 CHW with
  a coin-flip mirror; ``num_threads`` = workers, DALI's PyTorch iterator;
- ``SPDL``: Meta's thread-based pipeline (``spdl.pipeline``): per image ``spdl.io.demux_image`` and
  ``decode_packets`` with an FFmpeg filter graph doing the crop, bilinear scale and flip; ``concurrency`` and
  ``num_threads`` = workers; batches stacked in a pipe stage;
- ``LitData``: ``litdata.optimize`` packs the JPEG bytes into local chunks, a ``StreamingDataset`` decodes them
  (``torchvision.io.decode_jpeg``, LitData's serializer) before torchvision's v2 crop and flip in a
  ``StreamingDataLoader`` with ``--workers`` processes.

A peer that does not import is skipped and said so. They are not dependencies of the package: ``pip install
nvidia-dali-cuda120 nvidia-nvimgcodec-cu12 spdl litdata`` (SPDL decodes through FFmpeg's shared libraries,
``libavcodec`` 4-9: Debian ``apt-get install libavcodec59 libavfilter8 libavformat59 libavdevice59``). The ceiling
of the same run is one core reading and fully decoding every file (the faster of PIL and ``decode_jpeg``) times
the workers. Data: the demo's photo-like JPEGs plus, with ``--kinds``, kinds of the JPEG matrix
(:mod:`benchmarks.matrix`), so that no result rests on one kind of JPEG.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.litdata_rows import LitDataImages, labelled_files, optimize_folder
from benchmarks.matrix import KINDS, kind_folder
from lightning_fastdata.augment.geometry import CROP_DRAWS, random_resized_crop_box
from lightning_fastdata.demos import ensure_demo_data
from lightning_fastdata.measure import (
    Candidate,
    baseline_loader,
    ceiling_img_s,
    count_images,
    measure,
    ours_module,
    save_results,
)

__all__ = ["PEERS", "dali_loader", "litdata_loader", "main", "peers_suite", "spdl_loader"]

#: The peers' names as the rows print them, and the module each needs.
PEERS = {"DALI (CPU)": "nvidia.dali", "SPDL": "spdl.io", "LitData": "litdata"}

DEMO = "demo 500x375 q90"

#: The matrix's kinds measured beside the demo's data by default: the hard one (small, q75), a large one, a huge one.
KINDS_MEASURED = ["photo 640x480 q75", "photo 1000x750 q95", "photo 2000x1500 q90"]


def available(name: str) -> bool:
    """Whether peer ``name`` (a key of :data:`PEERS`) imports here."""
    import importlib

    try:
        importlib.import_module(PEERS[name])
    except Exception:  # noqa: BLE001 - a peer missing or broken here is skipped, never an error
        return False
    return True


class spdl_loader:  # noqa: N801 - used like the other loader factories
    """SPDL's pipeline over ``root``: one epoch per ``iter()``, a fresh shuffle and pipeline each time."""

    def __init__(self, root: str, size: int, batch_size: int, workers: int, seed: int = 0) -> None:
        self.items, self.size, self.batch_size = labelled_files(root), size, batch_size
        self.workers, self.epoch, self.seed = max(1, workers), 0, seed

    def _load(self, job: tuple[int, int]) -> tuple[torch.Tensor, int]:
        import spdl.io

        index, epoch = job
        path, label = self.items[index]
        rng = np.random.default_rng((self.seed, epoch, index))
        packets = spdl.io.demux_image(path)
        codec = packets.codec
        top, left, h, w = random_resized_crop_box(rng.random(CROP_DRAWS), codec.width, codec.height)
        flip = "hflip," if rng.random() < 0.5 else ""
        graph = f"crop={w}:{h}:{left}:{top},scale={self.size}:{self.size}:flags=bilinear,{flip}format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=graph)
        return spdl.io.to_torch(spdl.io.convert_frames(frames)), label

    @staticmethod
    def _collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([s[0] for s in samples]).permute(0, 3, 1, 2)  # N x 3 x H x W (a channels-last view)
        return images, torch.tensor([s[1] for s in samples])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from spdl.pipeline import PipelineBuilder

        order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.items))
        jobs = [(int(i), self.epoch) for i in order]
        self.epoch += 1
        pipeline = (
            PipelineBuilder()
            .add_source(jobs)
            .pipe(self._load, concurrency=self.workers)
            .aggregate(self.batch_size)
            .pipe(self._collate)
            .add_sink(4)
            .build(num_threads=self.workers)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()


class dali_loader:  # noqa: N801
    """DALI's CPU pipeline over ``root`` (see the module docstring), yielding ``(images, labels)`` torch batches."""

    def __init__(self, root: str, size: int, batch_size: int, workers: int, seed: int = 0) -> None:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(batch_size=batch_size, num_threads=max(1, workers), device_id=None, seed=seed)
        def pipe() -> Any:
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
            images = fn.decoders.image_random_crop(
                jpegs,
                device="cpu",
                output_type=types.RGB,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
                num_attempts=10,
            )
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True)
            images = fn.crop_mirror_normalize(
                images, dtype=types.UINT8, output_layout="CHW", mirror=fn.random.coin_flip()
            )
            return images, labels

        pipeline = pipe()
        pipeline.build()
        self.iterator = DALIGenericIterator(
            [pipeline],
            ["images", "labels"],
            reader_name="Reader",
            last_batch_policy=LastBatchPolicy.PARTIAL,
            auto_reset=True,
        )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for out in self.iterator:
            yield out[0]["images"], out[0]["labels"].view(-1)


def litdata_loader(root: str, work: str, size: int, batch_size: int, workers: int) -> Any:
    """LitData on ``root``: ``litdata.optimize`` into ``work`` (reused when there), then a ``StreamingDataLoader``."""
    import litdata

    out = Path(work, "litdata-optimized")
    if not (out / "index.json").exists():
        optimize_folder(root, out, "64MB")
    dataset = LitDataImages(str(out), shuffle=True, size=size, normalise=False)
    return litdata.StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
    )


def kind_rows(name: str, folder: str, args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """One data set's interleaved measurement: the rows of the module docstring, with each one's ratios."""
    files = sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))
    scratch = Path(args.scratch, Path(folder).name)
    scratch.mkdir(parents=True, exist_ok=True)
    size, batch, workers = args.image_size, args.batch_size, args.workers
    plain = ours_module(folder, size, batch, workers)
    indexed = ours_module(folder, size, batch, workers, entropy_index_dir=str(scratch / "entropy-index"))
    candidates: list[Candidate] = [
        ("baseline (torchvision ImageFolder)", lambda: baseline_loader(folder, size, batch, workers), count_images),
        ("ImageFolderDataModule (first epoch)", plain.train_dataloader, count_images),
        ("ImageFolderDataModule (epochs 2+)", indexed.train_dataloader, count_images),
    ]
    makers: dict[str, Callable[[], Any]] = {
        "DALI (CPU)": lambda: dali_loader(folder, size, batch, workers),
        "SPDL": lambda: spdl_loader(folder, size, batch, workers),
        "LitData": lambda: litdata_loader(folder, str(scratch), size, batch, workers),
    }
    skipped = []
    for peer in args.peers:
        if available(peer):
            candidates.append((peer, makers[peer], count_images))
        else:
            skipped.append(peer)
            say(f"bench peers: {peer} does not import here ({PEERS[peer]}): its row is skipped")
    ceiling = ceiling_img_s(files, args.repeats, workers)
    rates = measure(candidates, args.repeats, args.min_seconds)
    base = statistics.median(next(iter(rates.values())))
    rows: list[dict[str, Any]] = [
        {
            "loader": loader,
            "images_per_s": statistics.median(runs),
            "runs": runs,
            "vs_baseline": statistics.median(runs) / base,
            "vs_ceiling": statistics.median(runs) / ceiling,
        }
        for loader, runs in rates.items()
    ]
    peers = [r for r in rows if r["loader"] in PEERS]
    best = max(peers, key=lambda r: r["images_per_s"]) if peers else None
    ours = rows[2]["images_per_s"]
    return {
        "data": name,
        "files": len(files),
        "mean_kb": statistics.mean(os.path.getsize(f) for f in files) / 1e3,
        "ceiling_img_s": ceiling,
        "rows": rows,
        "skipped": skipped,
        "best_peer": best["loader"] if best else None,
        "ours_vs_best_peer": ours / best["images_per_s"] if best else None,
        "first_epoch_vs_best_peer": rows[1]["images_per_s"] / best["images_per_s"] if best else None,
    }


def print_peers(results: list[dict[str, Any]]) -> None:
    """One markdown table per data set."""
    for r in results:
        print(f"\n{r['data']}: {r['files']} files, mean {r['mean_kb']:.0f} KB, ceiling {r['ceiling_img_s']:.0f} img/s")
        print("| loader | images/s | vs baseline | vs ceiling |")
        print("|---|---:|---:|---:|")
        for row in r["rows"]:
            rate, base, ceiling = row["images_per_s"], row["vs_baseline"], row["vs_ceiling"]
            print(f"| {row['loader']} | {rate:.0f} | {base:.2f}x | {ceiling:.2f}x |")
        if r["best_peer"]:
            print(
                f"ours (epochs 2+) vs the best peer ({r['best_peer']}): {r['ours_vs_best_peer']:.2f}x; "
                f"first epoch: {r['first_epoch_vs_best_peer']:.2f}x"
            )


def peers_suite(args: argparse.Namespace, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The demo's data (``args.root``, generated if missing) and each of ``args.kinds``, measured in turn."""
    results = []
    sets = []
    if args.demo:
        ensure_demo_data(args.root, 8, max(1, args.files // 8))
        sets.append((DEMO, str(args.root)))
    for kind in args.kinds:
        sets.append((kind, str(kind_folder(args.scratch, kind, args.files))))
    for name, folder in sets:
        results.append(kind_rows(name, folder, args, say))
        print_peers(results[-1:])
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default="data/bench", help="the demo's JPEG folder (generated if missing)")
    parser.add_argument("--kinds", nargs="*", choices=list(KINDS), default=KINDS_MEASURED)
    parser.add_argument(
        "--demo", action=argparse.BooleanOptionalAction, default=True, help="measure the demo's data (--root) too"
    )
    parser.add_argument("--peers", nargs="*", choices=list(PEERS), default=list(PEERS))
    parser.add_argument(
        "--files",
        type=int,
        default=1536,
        help="JPEGs per data set (of more than 1.5 MP: fewer; keep a multiple of 2 x batch x workers there, or the "
        "last batches of each pass leave workers idle)",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=4.0)
    parser.add_argument(
        "--scratch", default=None, help="generated kinds, indexes, LitData chunks (kept); default: temp"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.scratch is None:
            args.scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="fastdata-peers-"))
        results = peers_suite(args)
    return save_results(args.json, args, versions=_versions(args.peers), sets=results)


def _versions(peers: list[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    names = {"DALI (CPU)": "nvidia-dali-cuda120", "SPDL": "spdl_io", "LitData": "litdata"}
    found = {}
    for peer in peers:
        with contextlib.suppress(PackageNotFoundError):
            found[peer] = version(names[peer])
    return found


if __name__ == "__main__":
    main()
