"""The entropy index on a matrix of JPEG kinds: sizes, qualities, subsampling, content, restart markers.

    python -m benchmarks.matrix --json benchmarks/results/jpeg-matrix.json
    fastdata bench --suites matrix ...   (the same rows, inside the bench's JSON)

For each kind, a folder of generated JPEGs (in ``--scratch``), then one interleaved measurement of, on the same
files with the same workers: the folder module without an index (``entropy_index=False``: today's first epoch),
with a dense index (one entry per MCU: the format before this one, for its speed), and with the index as it is
built by default (an entry every K MCUs within 1.5% of each file's bytes: every epoch after the first). Beside
them, the ceiling of the same run: one core reading and fully decoding every file (the faster of PIL and
``decode_jpeg``), times the workers. Rows: images/s, each loader's ratio to the ceiling, the indexed loader's
ratio to no index ("never slower": >= 1.0 within noise), and each index's bytes as a share of the JPEG bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import statistics
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from lightning_fastdata.demos import photo_like_image
from lightning_fastdata.loading.index.files import scan_image_folder
from lightning_fastdata.loading.jpeg import entropy_index as entropy
from lightning_fastdata.loading.jpeg.entropy_index_build import build_entropy_index
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.measure import Candidate, ceiling_img_s, count_images, measure, ours_module, save_results

__all__ = ["FILES", "KINDS", "first_epoch", "flat_image", "kind_folder", "main", "make_kind", "matrix_suite"]

#: JPEGs generated per kind (half as many of the 2000 x 1500 kind), as many as the folder suite's data set.
FILES = 1536

#: name -> (width, height, quality, subsampling (0: 4:4:4, 2: 4:2:0), content, restart_marker_rows)
KINDS: dict[str, tuple[int, int, int, int, str, int]] = {
    "photo 256x192 q75": (256, 192, 75, 2, "photo", 0),
    "photo 500x375 q90": (500, 375, 90, 2, "photo", 0),
    "photo 640x480 q75": (640, 480, 75, 2, "photo", 0),
    "photo 800x600 q90 4:4:4": (800, 600, 90, 0, "photo", 0),
    "photo 1000x750 q95": (1000, 750, 95, 2, "photo", 0),
    "photo 2000x1500 q90": (2000, 1500, 90, 2, "photo", 0),
    "photo 640x480 q90 restarts": (640, 480, 90, 2, "photo", 1),
    "flat 800x600 q90": (800, 600, 90, 2, "flat", 0),
}


def flat_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Flat content (a screenshot, a chart, a scan of a page): solid areas, thin lines, no grain."""
    image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(180, 256, 3)))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        x1, y1 = x0 + int(rng.integers(8, width // 2)), y0 + int(rng.integers(8, height // 2))
        draw.rectangle((x0, y0, x1, y1), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    for y in range(0, height, 14):  # lines of "text"
        if rng.random() < 0.6:
            draw.line((10, y, int(rng.integers(20, width - 10)), y), fill=(20, 20, 20), width=2)
    return image


def _write(job: tuple[str, str, int, int]) -> None:
    folder, kind, start, count = job
    width, height, quality, subsampling, content, restarts = KINDS[kind]
    for i in range(start, start + count):
        rng = np.random.default_rng(1_000_003 * (1 + list(KINDS).index(kind)) + i)
        if content == "photo":
            image = photo_like_image(rng, width, height, (i % 8) / 8)
        else:
            image = flat_image(rng, width, height)
        buf = io.BytesIO()
        options: dict[str, Any] = {"quality": quality, "subsampling": subsampling}
        if restarts:
            options["restart_marker_rows"] = restarts
        image.save(buf, "JPEG", **options)
        Path(folder, f"class_{i % 2}", f"img_{i:05d}.jpg").write_bytes(buf.getvalue())


def make_kind(root: str | os.PathLike[str], kind: str, files: int, processes: int = 2) -> Path:
    """A folder of ``files`` JPEGs of ``kind`` in two classes (reused when already whole)."""
    folder = Path(root) / kind.replace(" ", "_").replace(":", "")
    done = folder / ".complete"
    if done.exists() and done.read_text() == str(files):
        return folder
    for c in range(2):
        (folder / f"class_{c}").mkdir(parents=True, exist_ok=True)
    step = -(-files // (4 * processes))
    jobs = [(str(folder), kind, s, min(step, files - s)) for s in range(0, files, step)]
    with get_context("fork").Pool(processes) as pool:
        pool.map(_write, jobs)
    done.write_text(str(files))
    return folder


def kind_folder(scratch: str | os.PathLike[str], kind: str, files: int) -> Path:
    """``kind``'s folder under ``scratch/data`` with ``files`` JPEGs, fewer above 1.5 MP (half as many 2000 x 1500)."""
    width, height = KINDS[kind][:2]
    return make_kind(Path(scratch, "data"), kind, max(16, int(files * min(1.0, 1.5e6 / (width * height)))))


def _index_share(index_dir: str, dm: Any, jpeg_bytes: int) -> float:
    """The index's bytes over the JPEG bytes of the files it indexes."""
    folder = entropy.entropy_index_folder(index_dir, dm.train_dataset.index)
    return (folder / "blob.bin").stat().st_size / jpeg_bytes


def kind_rows(folder: Path, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One kind's interleaved measurement (see the module docstring)."""
    files = sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))
    jpeg_bytes = sum(os.path.getsize(f) for f in files)
    scratch = Path(args.scratch, folder.name)
    built: dict[str, Any] = {}
    for name, fraction in (("dense", 1.0), ("sparse", entropy.INDEX_FRACTION)):
        where = str(scratch / f"index-{name}")
        # built here with its budget; the module then reuses it (an index is reused whatever its budget)
        build_entropy_index(scan_image_folder(str(folder)), open_storage(str(folder)), where, fraction=fraction)
        built[name] = ours_module(str(folder), args.image_size, args.batch_size, args.workers, entropy_index_dir=where)
        built[name + "_share"] = _index_share(where, built[name], jpeg_bytes)
    plain = ours_module(str(folder), args.image_size, args.batch_size, args.workers)
    candidates: list[Candidate] = [
        ("no index (entropy_index=False; the first epoch)", plain.train_dataloader, count_images),
        ("dense index (one entry per MCU)", built["dense"].train_dataloader, count_images),
        ("index as built by default (epochs 2+)", built["sparse"].train_dataloader, count_images),
    ]
    ceiling = ceiling_img_s(files, args.repeats, args.workers)
    rates = measure(candidates, args.repeats, args.min_seconds)
    rows: list[dict[str, Any]] = [
        {"loader": name, "images_per_s": statistics.median(runs), "runs": runs} for name, runs in rates.items()
    ]
    for row in rows:
        row["vs_ceiling"] = row["images_per_s"] / ceiling
    width, height = KINDS[kind][:2]
    return {
        "kind": kind,
        "files": len(files),
        "mean_kb": jpeg_bytes / len(files) / 1e3,
        "short_side": min(width, height),
        "ceiling_img_s": ceiling,
        "rows": rows,
        "index_share": {"dense": built["dense_share"], "sparse": built["sparse_share"]},
        "sparse_vs_none": rows[2]["images_per_s"] / rows[0]["images_per_s"],
        "sparse_vs_dense": rows[2]["images_per_s"] / rows[1]["images_per_s"],
    }


def _epoch_seconds(loader: Any, step_s: float = 0.0) -> float:
    """One pass over ``loader``; ``step_s``: the consumer's time per batch (a stand-in for a training step)."""
    start = time.perf_counter()
    for _ in loader:
        if step_s:
            time.sleep(step_s)
    return time.perf_counter() - start


def first_epoch(folder: Path, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The default module's first epochs while its index is built in the background, against no index at all.

    Each repeat: a fresh ``index_dir``; the default module (``entropy_index="auto"``: ``prepare_data`` starts the
    paced background build, training starts at once) times its epochs 1 to ``args.epochs`` from the first ``iter``
    to the last batch (worker start-up included), noting after each epoch how many files the build had covered
    (its finished pieces, which the loaders take up as they come) and after which epoch it had finished; then
    ``entropy_index=False`` times its epochs 1 to 3 the same way; interleaved. "auto: last 3" is the mean rate of
    the default module's last three epochs (the index taken up, where the build ended early enough); "auto: while
    built" its mean rate over epochs 2 to the one after which the index was whole (to the last, if it never was). With
    ``args.step_ms``, each batch is followed by that long a sleep (a training step that leaves CPUs idle).
    """
    from lightning_fastdata import ImageFolderDataModule

    files = len(glob.glob(os.path.join(folder, "*", "*.jpg")))
    epochs = max(3, args.epochs)
    runs: dict[str, list[float]] = {f"auto: epoch {e}": [] for e in range(1, epochs + 1)}
    runs.update({"auto: last 3": [], "auto: while built": [], "off: epoch 1": [], "off: epochs 2-3": []})
    built_after: list[int | None] = []
    indexed: list[list[int]] = []
    step = args.step_ms / 1e3
    common = {"val_fraction": 0.0, "image_size": args.image_size, "batch_size": args.batch_size}
    for r in range(args.repeats):
        where = Path(args.scratch, folder.name, f"first-epoch-{time.time_ns()}-{r}")
        auto = ImageFolderDataModule(str(folder), num_workers=args.workers, index_dir=str(where), **common)
        auto.prepare_data()
        auto.setup("fit")
        loader = auto.train_dataloader()
        pending = getattr(auto.train_dataset, "entropy_indexes", None)
        if not isinstance(pending, entropy.PendingEntropyIndex):
            raise RuntimeError(f"the default module has no index being built in {where} (the decoder is missing?)")
        # a watcher of its own: the dataset's copy (which forked workers would inherit) is left as training leaves it
        watch = entropy.PendingEntropyIndex(where, pending.index)
        built_after.append(None)
        indexed.append([])
        seconds = []
        for epoch in range(1, epochs + 1):
            seconds.append(_epoch_seconds(loader, step))
            runs[f"auto: epoch {epoch}"].append(files / seconds[-1])
            indexed[-1].append(watch.covered())
            if built_after[-1] is None and indexed[-1][-1] == files:
                built_after[-1] = epoch
        runs["auto: last 3"].append(
            statistics.mean(runs[f"auto: epoch {e}"][-1] for e in range(epochs - 2, epochs + 1))
        )
        building = seconds[1 : max(2, built_after[-1] or epochs)]
        runs["auto: while built"].append(files * len(building) / sum(building))
        del loader
        off = ImageFolderDataModule(str(folder), num_workers=args.workers, entropy_index=False, **common)
        off.setup("fit")
        loader = off.train_dataloader()
        runs["off: epoch 1"].append(files / _epoch_seconds(loader, step))
        runs["off: epochs 2-3"].append(2 * files / (_epoch_seconds(loader, step) + _epoch_seconds(loader, step)))
        del loader
    rates = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "kind": kind,
        "files": files,
        "epochs": epochs,
        "img_s": rates,
        "runs": runs,
        "built_after_epoch": built_after,
        "indexed_after_epoch": indexed,
        "step_ms": args.step_ms,
        "epoch1_vs_off": rates["auto: epoch 1"] / rates["off: epoch 1"],
        "epoch2_vs_off": rates["auto: epoch 2"] / rates["off: epoch 1"],
        "last3_vs_off": rates["auto: last 3"] / rates["off: epochs 2-3"],
        "while_built_vs_off": rates["auto: while built"] / rates["off: epochs 2-3"],
    }


def print_matrix(results: list[dict[str, Any]]) -> None:
    """One markdown row per kind."""
    print(
        "| JPEG kind | KB | ceiling img/s | no index | dense index | default index | default vs none "
        "| index bytes: dense / default |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        cells = " | ".join(f"{row['images_per_s']:.0f} ({row['vs_ceiling']:.2f}x)" for row in r["rows"])
        share = r["index_share"]
        print(
            f"| {r['kind']} | {r['mean_kb']:.0f} | {r['ceiling_img_s']:.0f} | {cells} | {r['sparse_vs_none']:.2f}x "
            f"| {100 * share['dense']:.1f}% / {100 * share['sparse']:.2f}% |"
        )


def matrix_suite(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every kind of ``args.kinds``: its folder made (or reused) in ``args.scratch``, then measured."""
    results = []
    for kind in args.kinds:
        folder = kind_folder(args.scratch, kind, args.files)
        results.append(kind_rows(folder, kind, args))
        print_matrix(results[-1:])
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--files", type=int, default=FILES, help="JPEGs per kind (of more than 1.5 MP: fewer)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--scratch", default=None, help="where the data and indexes go (kept); default: a temp folder")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--first-epoch",
        action="store_true",
        help="instead: each kind's first --epochs epochs with the default module (its index built in the "
        "background meanwhile) against epochs without an index (first_epoch)",
    )
    parser.add_argument("--epochs", type=int, default=3, help="with --first-epoch: the default module's epochs")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="with --first-epoch: a sleep after each batch (a training step)"
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.scratch is None:
            args.scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="fastdata-matrix-"))
        if args.first_epoch:
            return _first_epochs(args)
        results = matrix_suite(args)
    print()
    print_matrix(results)
    return save_results(args.json, args, kinds=results)


def _first_epochs(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for kind in args.kinds:
        folder = kind_folder(args.scratch, kind, args.files)
        results.append(first_epoch(folder, kind, args))
        r = results[-1]
        cells = ", ".join(
            f"{name} {rate:.0f}" for name, rate in r["img_s"].items() if not name.startswith("auto: epoch ")
        )
        print(
            f"{kind}: img/s {cells}; epoch 1 with the background build {r['epoch1_vs_off']:.2f}x no index, "
            f"epoch 2 {r['epoch2_vs_off']:.2f}x, epochs 2 to whole {r['while_built_vs_off']:.2f}x; index whole "
            f"after epoch {r['built_after_epoch']}; the last 3 epochs {r['last3_vs_off']:.2f}x no index"
        )
    return save_results(args.json, args, kinds=results)


if __name__ == "__main__":
    main()
