"""One source for every published figure: the README's and the docs' numbers, taken from ``benchmarks/results``.

A page names a figure instead of typing it, between markers that render as nothing:

- inline: ``<!--fig:folder.vs_baseline-->3.0x<!--/fig-->`` (the text between is the figure, as it renders);
- a whole block (a table with its caption): ``<!--figures:folder-table-->`` ... ``<!--/figures-->``.

``python -m benchmarks.figures --write`` rewrites every marked figure and block from the results files;
``python -m benchmarks.figures`` (``--check``) lists the ones that differ and exits 1 (tests/test_docs.py runs it, so
a page cannot publish a figure that is not the latest result's). A new run: write its JSON over the results file
the figure names (``fastdata bench ... --json benchmarks/results/latest.json``), then ``--write``.

Each figure carries its results file, so its machine and date are the file's (the ``date`` field the benchmark
writes, else the date git last changed the file); a block's caption states both.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

#: The pages whose figures come from here (and which may hold no ratio typed by hand: tests/test_docs.py).
PAGES = (
    "README.md",
    *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md") if p.name not in ("benchmarks.md", "changelog.md")),
)

__all__ = ["BLOCKS", "FIGURES", "PAGES", "check", "render", "write"]


@cache
def result(name: str) -> Any:
    """A results file of ``benchmarks/results`` (``name`` without ``.json``), parsed (an object, or a list of rows)."""
    return json.loads((RESULTS / f"{name}.json").read_text())


@cache
def date_of(name: str) -> str:
    """When a results file was measured: its ``date`` field, else the day git last changed it (YYYY-MM-DD)."""
    data = result(name)
    written = data.get("date") if isinstance(data, dict) else None
    if written:
        return str(written)
    out = subprocess.run(
        ["git", "log", "-1", "--format=%cs", "--", str(RESULTS / f"{name}.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not out:
        raise ValueError(f"benchmarks/results/{name}.json has no 'date' field and is not committed: add the date.")
    return out


def machine(name: str) -> str:
    """The machine a results file was measured on, as the captions say it: ``a 2-core x86_64 VM``."""
    parts = [p.strip() for p in str(result(name)["machine"]).split(",")]
    cpus = next((p.split()[0] for p in parts if p.endswith("CPUs")), None)
    if cpus is None:  # written in words already ("2-core VM, no GPU")
        return f"a {parts[0]}"
    return f"a {cpus}-core {parts[0]} VM"


def row(name: str, loader: str, workers: int = 2, suite: str | None = None) -> dict[str, Any]:
    """The row of ``loader`` with ``workers`` in a results file (in ``suite`` for ``fastdata bench`` files)."""
    data = result(name)
    rows = data["rows"] if suite is None else data["suites"][suite]
    if isinstance(rows, dict):
        rows = rows["rows"]
    for r in rows:
        if r["loader"] == loader and r.get("num_workers", workers) == workers:
            return dict(r)
    raise KeyError(f"benchmarks/results/{name}.json has no row {loader!r} with {workers} workers")


def times(value: float) -> str:
    """A ratio as the pages print it: ``3.04`` -> ``3.0x``, ``17.6`` -> ``18x``, ``0.94`` -> ``0.94x``."""
    if value >= 10:
        return f"{value:.0f}x"
    if value < 1:
        return f"{value:.2f}x"
    return f"{value:.1f}x"


def times2(value: float) -> str:
    """A ratio with two decimals (``1.30x``): where the pages compare close figures."""
    return f"{value:.2f}x"


def count(value: float) -> str:
    """Images per second as the pages print them: ``2662.4`` -> ``2,662``."""
    return f"{value:,.0f}"


def _find(rows: Iterable[dict[str, Any]], key: str, value: str) -> dict[str, Any]:
    """The row whose ``key`` is ``value`` (a results file's rows are named by their loader, variant or what)."""
    for r in rows:
        if r[key] == value:
            return r
    raise KeyError(f"no row with {key} {value!r} in the results")


def _folder(loader: str) -> dict[str, Any]:
    return row("latest", loader, 2, "folder")


def _cache(loader: str) -> dict[str, Any]:
    return row("latest", loader, 2, "cache")


def _recipe(loader: str, name: str = "recipe") -> dict[str, Any]:
    return row(name, loader, 2, "recipe")


def _s3(loader: str) -> dict[str, Any]:
    return row("s3-folder-pinned-4", loader, 2)


def _s3_vs(ours: str, other: str) -> float:
    return float(_s3(ours)["images_per_s"] / _s3(other)["images_per_s"])


def _scale(part: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = result("scale")["suites"]["scale"][part]
    return rows


def _formats(loader: str) -> dict[str, Any]:
    return _find(result("scale-formats"), "loader", loader)


def _mechanism(variant: str) -> dict[str, Any]:
    return _find(result("gpu")["mechanisms"], "variant", variant)


def _fed(loader: str) -> float:
    return float(_find(result("gpu")["fed"], "loader", loader)["fed_ratio"])


def _decoder_gain() -> str:
    """torchvision's ``decode_jpeg`` against PIL, one core's full decode of the folder suite's photos (``+7%``)."""
    ceiling = result("latest")["decode_ceiling_1core"]
    return f"{100 * (ceiling['decode_jpeg'] / ceiling['PIL'] - 1):+.0f}%"


def _raw_cold_share() -> str:
    """The raw formats' cold rate as a share of their warm rate, lowest to highest (``65-79%``)."""
    rows = _scale("cold_reads")
    shares = [r["cold_vs_warm"] for r in rows if "raw" in r["loader"] or r["loader"].startswith("TensorCache")]
    return f"{100 * min(shares):.0f}-{100 * max(shares):.0f}%"


_FOLDER, _INDEXED = "ImageFolderDataModule", "ImageFolderDataModule (entropy_index=True)"
_CACHE_WORKERS = "TensorCacheDataModule, augment in workers"
_CACHE_DEVICE = "TensorCacheDataModule, augment on device (loader only)"
_S3_LOCAL, _S3_DIRECT = "ImageFolderDataModule (local)", "ImageFolderDataModule (s3, direct)"
_S3_DELAYED = "ImageFolderDataModule (s3, +20 ms/request)"
_S3_PER_ITEM = "per-item get_object + PIL + torchvision (s3, direct)"
_S3_LITDATA = "LitData (s3, direct, cache < data)"
_WORKERS, _DEVICE = "ours, policy in workers (loader only)", "ours, policy on the device (loader only)"
_WORKERS_INDEXED = "ours, policy in workers, entropy_index=True (loader only)"
_DEVICE_INDEXED = "ours, policy on the device, entropy_index=True (loader only)"
_LARGE = "recipe-large-jpegs"
_JPEG_CACHE, _RAW_CACHE = "TensorCacheDataModule storage='jpeg' (256, q90)", "TensorCacheDataModule (256 px uint8)"
_ORIGINALS = "ImageFolderDataModule (original JPEGs)"


#: Every named figure: a function of the results files giving the text the pages show.
#: The shards suite's rows (lightning_fastdata.bench.shards).
_WDS, _HUB = "webdataset + torchvision (shuffle buffer 1000)", "datasets + torchvision (with_transform)"
_TAR, _PARQUET, _SAME = "ShardDataModule (tar)", "ShardDataModule (parquet)", "ImageFolderDataModule (same images)"


def _shards(name: str, loader: str) -> dict[str, Any]:
    return row(name, loader, suite="shards")


def _shards_vs_folder(name: str, loader: str) -> str:
    return times2(float(_shards(name, loader)["images_per_s"] / _shards(name, _SAME)["images_per_s"]))


def _shards_figures() -> dict[str, Callable[[], str]]:
    """Each set's (``shards-demo``, ``shards-large``) rates and ratios, and the bucket run's (``shards-s3``)."""
    out: dict[str, Callable[[], str]] = {}
    for key in ("demo", "large"):
        name = f"shards-{key}"
        for short, loader in (("wds", _WDS), ("tar", _TAR), ("hub", _HUB), ("parquet", _PARQUET)):
            out[f"shards.{key}_{short}"] = functools.partial(_shards_rate, name, loader)
        out[f"shards.{key}_vs_wds"] = functools.partial(_shards_ratio, name, _TAR)
        out[f"shards.{key}_vs_hub"] = functools.partial(_shards_ratio, name, _PARQUET)
        out[f"shards.{key}_tar_vs_folder"] = functools.partial(_shards_vs_folder, name, _TAR)
        out[f"shards.{key}_parquet_vs_folder"] = functools.partial(_shards_vs_folder, name, _PARQUET)
    for short in ("tar", "parquet"):
        out[f"shards.s3_{short}"] = functools.partial(_s3_vs_local, f"{short}, s3 direct")
        out[f"shards.s3_{short}_delay"] = functools.partial(_s3_vs_local, f"{short}, s3 +20 ms/request")
    earlier = functools.partial(_s3_earlier, "tar_per_member_vs_local")
    out["shards.s3_tar_per_member"] = functools.partial(lambda f: times2(f()["direct"]), earlier)
    out["shards.s3_tar_per_member_delay"] = functools.partial(lambda f: times2(f()["delay_20ms"]), earlier)
    out["shards.s3_date"] = functools.partial(date_of, "shards-s3")
    out["shards.s3_machine"] = functools.partial(machine, "shards-s3")
    indexed = "ShardDataModule (tar, entropy_index=True)"
    out["shards.demo_tar_indexed"] = functools.partial(_shards_rate, "shards-demo", indexed)
    out["shards.demo_indexed_vs_wds"] = functools.partial(_shards_ratio, "shards-demo", indexed)
    out["shards.demo_indexed_vs_tar"] = functools.partial(_shards_between, "shards-demo", indexed, _TAR)
    keys = (
        "vs_webdataset",
        "vs_datasets",
        "parquet_vs_folder",
        "tar_vs_folder",
        "bucket_vs_local",
        "tar_entropy_vs_tar",
    )
    for key in keys:
        out[f"shards.predicted_{key}"] = functools.partial(_shards_predicted, key)
    return out


def _shards_rate(name: str, loader: str) -> str:
    return count(_shards(name, loader)["images_per_s"])


def _shards_ratio(name: str, loader: str) -> str:
    return times(_shards(name, loader)["vs_baseline"])


def _shards_between(name: str, loader: str, other: str) -> str:
    return times2(float(_shards(name, loader)["images_per_s"] / _shards(name, other)["images_per_s"]))


def _shards_predicted(key: str) -> str:
    return str(result("shards-demo")["predicted"][key])


def _s3_earlier(key: str) -> Any:
    return result("shards-s3")["earlier"][key]


def _s3_vs_local(loader: str) -> str:
    return times2(_s3_shards(loader)["vs_local"])


def _s3_shards(loader: str) -> dict[str, Any]:
    return next(r for r in result("shards-s3")["rows"] if r["loader"] == loader)


#: The segmentation suite's rows (lightning_fastdata.bench.segmentation) and its results files.
_SEG_REFERENCE, _SEG_OURS = "torchvision reference (v2, PIL)", "SegmentationDataModule (loader only)"
_SEG_CPU, _SEG_HDF5 = "SegmentationDataModule + CPU normalise", "SegmentationDataModule (HDF5, encoded)"
_SEG_CACHE = "SegmentationDataModule (cache_dir: decoded once)"
_SEG_INDEXED = "SegmentationDataModule (entropy_index)"
_SEG_SETS = {"demo": "segmentation-demo", "large": "segmentation-large"}


def _seg(key: str, loader: str) -> dict[str, Any]:
    return row(_SEG_SETS[key], loader, suite="segmentation")


def _seg_suite(key: str) -> dict[str, Any]:
    suite: dict[str, Any] = result(_SEG_SETS[key])["suites"]["segmentation"]
    return suite


def _segmentation_table() -> str:
    """The segmentation page's table: both sets' rows, ratios to the reference, the decode ceiling."""
    header = ["loader"]
    for key in _SEG_SETS:
        data = _seg_suite(key)["data"]
        size = data["root"].rsplit("scenes-", 1)[-1].rsplit("-", 1)[0].replace("-q", " q")
        header.append(f"{data['images']} scenes {size} (`{_SEG_SETS[key]}.json`)")
    labels = [
        ("torchvision's reference training preset (the baseline)", _SEG_REFERENCE),
        ("`SegmentationDataModule`, loader only", _SEG_OURS),
        ("`SegmentationDataModule` + its device side on the CPU (normalise, int64 masks)", _SEG_CPU),
        ("`SegmentationDataModule`, the same scenes in one HDF5 file (encoded), loader only", _SEG_HDF5),
        ("`SegmentationDataModule(cache_dir=...)`: decoded once at the base size, loader only", _SEG_CACHE),
        ("`SegmentationDataModule(entropy_index=True)`: each crop entropy-decoded alone, loader only", _SEG_INDEXED),
    ]
    rows = []
    for label, loader in labels:
        cells = [label]
        for key in _SEG_SETS:
            r = _seg(key, loader)
            ratio = "" if loader == _SEG_REFERENCE else f" ({times(r['vs_baseline'])})"
            cells.append(count(r["images_per_s"]) + ratio)
        rows.append(cells)
    ceiling = ["one core reading and fully decoding image and mask (the ceiling)"]
    ceiling += [count(_seg_suite(key)["decode_ceiling_1core"]) for key in _SEG_SETS]
    return _table(header, [*rows, ceiling])


def _segmentation_figures() -> dict[str, Callable[[], str]]:
    out: dict[str, Callable[[], str]] = {
        "segmentation.date": lambda: date_of("segmentation-demo"),
        "segmentation.machine": lambda: machine("segmentation-demo"),
        "segmentation.predicted": lambda: str(result("segmentation-demo")["predicted"]),
    }
    for key in _SEG_SETS:
        out[f"segmentation.{key}_vs"] = functools.partial(lambda k: times(_seg(k, _SEG_OURS)["vs_baseline"]), key)
        out[f"segmentation.{key}_cpu_vs"] = functools.partial(lambda k: times(_seg(k, _SEG_CPU)["vs_baseline"]), key)
    return out


def _predict(loader_prefix: str) -> list[float]:
    """The predict suite's ``vs_baseline`` of the row starting ``loader_prefix``, one per kind of JPEG."""
    return [
        next(r for r in k["rows"] if r["loader"].startswith(loader_prefix))["vs_baseline"]
        for k in result("predict")["kinds"]
    ]


FIGURES: dict[str, Callable[[], str]] = {
    "sampling.loader": lambda: times2(result("sampling")["loader_ratio"]),
    "sampling.mix": lambda: times2(result("sampling")["mix_ratio"]),
    "sampling.mix_large": lambda: times2(result("sampling-large")["mix_ratio"]),
    "sampling.predicted_mix": lambda: times2(_sampling_predicted("folder loader, a mix of one source vs plain")),
    "sampling.loader_plain": lambda: count(result("sampling")["loader"][0]["images_per_s"]),
    "sampling.loader_weighted": lambda: count(result("sampling")["loader"][1]["images_per_s"]),
    "sampling.draw_10m": lambda: f"{_sampling_row(10_000_000, 'balanced, with replacement')['draw_s']:.2f} s",
    "sampling.draw_10m_without": lambda: (
        f"{_sampling_row(10_000_000, 'balanced, without replacement')['draw_s']:.2f} s"
    ),
    "sampling.peak_10m": lambda: f"{_sampling_row(10_000_000, 'balanced, with replacement')['draw_peak_mb']:.0f} MB",
    "sampling.date": lambda: date_of("sampling"),
    "sampling.predicted_loader": lambda: times2(_sampling_predicted("folder loader, balanced vs plain")),
    "sampling.predicted_draw": lambda: f"{_sampling_predicted('10M balanced, with replacement: draw s')} s",
    "sampling.predicted_peak": lambda: f"{_sampling_predicted('10M balanced, with replacement: peak MB')} MB",
    "sampling.machine": lambda: machine("sampling"),
    "shards.date": lambda: date_of("shards-demo"),
    "shards.machine": lambda: machine("shards-demo"),
    **_shards_figures(),
    **_segmentation_figures(),
    "predict.date": lambda: date_of("predict"),
    "predict.machine": lambda: machine("predict"),
    "predict.demo": lambda: times(_predict("ImageFolderDataModule predict_dataloader")[0]),
    "predict.demo_cpu": lambda: times(_predict("ImageFolderDataModule predict_dataloader + CPU")[0]),
    "predict.range": lambda: _ratio_range(_predict("ImageFolderDataModule predict_dataloader"), digits=1),
    "predict.predicted": lambda: times(result("predict")["predicted"]["loader_vs_baseline"]),
    "predict.predicted_cpu": lambda: times(result("predict")["predicted"]["cpu_normalise_vs_baseline"]),
    "predict.range_cpu": lambda: _ratio_range(_predict("ImageFolderDataModule predict_dataloader + CPU"), digits=1),
    "folder.date": lambda: date_of("latest"),
    "peers.date": lambda: date_of("peers"),
    "peers.best": lambda: _peers_best(),
    "no_decoder.range": lambda: _ratio_range([f["without_vs_with"] for f in result("no-decoder")["folders"]]),
    "first_epoch.range": lambda: _ratio_range([k["epoch1_vs_off"] for k in result("first-epoch")["kinds"]]),
    "first_epoch_paced.epoch1": lambda: _ratio_range([k["epoch1_vs_off"] for k in _paced()]),
    "first_epoch_paced.built_after": lambda: _int_range([e for k in _paced() for e in k["built_after_epoch"]]),
    "first_epoch_paced.after": lambda: _ratio_range([k["last3_vs_off"] for k in _paced()]),
    "first_epoch_pieces.epoch1": lambda: _ratio_range(
        [k["epoch1_vs_off"] for k in [*_pieces(), result("first-epoch-pieces")["epoch1_check"]]]
    ),
    "first_epoch_pieces.built_after": lambda: _int_range([e for k in _pieces() for e in k["built_after_epoch"]]),
    "first_epoch_pieces.while_built": lambda: _ratio_range([k["while_built_vs_off"] for k in _pieces()]),
    "first_epoch_pieces.after": lambda: _ratio_range([k["last3_vs_off"] for k in _pieces()]),
    "first_epoch_idle.built_after": lambda: _int_range(
        [e for k in result("first-epoch-idle")["kinds"] for e in k["built_after_epoch"]]
    ),
    "folder.vs_baseline": lambda: times(_folder(_FOLDER)["vs_baseline"]),
    "folder.ceiling": lambda: times(_folder(_FOLDER)["pct_of_decode_ceiling"] / 100),
    "folder.index_vs_baseline": lambda: times(_folder(_INDEXED)["vs_baseline"]),
    "folder.index_ceiling": lambda: times2(_folder(_INDEXED)["pct_of_decode_ceiling"] / 100),
    "folder.index_vs_plain": lambda: times2(_folder(_INDEXED)["images_per_s"] / _folder(_FOLDER)["images_per_s"]),
    "folder.index_img_s": lambda: count(_folder(_INDEXED)["images_per_s"]),
    "folder.img_s": lambda: count(_folder(_FOLDER)["images_per_s"]),
    "folder.decode_jpeg_vs_pil": _decoder_gain,
    "cache.workers_vs_baseline": lambda: times(_cache(_CACHE_WORKERS)["vs_baseline"]),
    "cache.device_vs_baseline": lambda: times(_cache(_CACHE_DEVICE)["vs_baseline"]),
    "scale.scan_vs_imagefolder": lambda: times(
        _find(_scale("scan"), "what", "scan_image_folder (ImageFolderDataModule.setup)")["vs_torchvision"]
    ),
    "scale.date": lambda: date_of("scale"),
    "scale.raw_cold_share": _raw_cold_share,
    "recipe.date": lambda: date_of("recipe"),
    "recipe.workers": lambda: times(_recipe(_WORKERS)["vs_baseline"]),
    "recipe.workers_cpu": lambda: times(
        _recipe("ours, policy in workers (+ normalise, erase, mix on this CPU)")["vs_baseline"]
    ),
    "recipe.workers_index": lambda: times(_recipe(_WORKERS_INDEXED)["vs_baseline"]),
    "recipe.device": lambda: times(_recipe(_DEVICE)["vs_baseline"]),
    "recipe.device_index": lambda: times2(_recipe(_DEVICE_INDEXED)["vs_baseline"]),
    "recipe.large.workers": lambda: times(_recipe(_WORKERS, _LARGE)["vs_baseline"]),
    "recipe.large.workers_index": lambda: times(_recipe(_WORKERS_INDEXED, _LARGE)["vs_baseline"]),
    "recipe.large.device": lambda: times(_recipe(_DEVICE, _LARGE)["vs_baseline"]),
    "recipe.large.device_index": lambda: times(_recipe(_DEVICE_INDEXED, _LARGE)["vs_baseline"]),
    "recipe.large.date": lambda: date_of(_LARGE),
    "s3.date": lambda: date_of("s3-folder-pinned-4"),
    "s3.direct_vs_local": lambda: times(_s3_vs(_S3_DIRECT, _S3_LOCAL)),
    "s3.delay_vs_local": lambda: times(_s3_vs(_S3_DELAYED, _S3_LOCAL)),
    "s3.vs_per_item": lambda: times(_s3_vs(_S3_DIRECT, _S3_PER_ITEM)),
    "s3.vs_litdata": lambda: times(_s3_vs(_S3_DIRECT, _S3_LITDATA)),
    "formats.jpeg_cache_vs_baseline": lambda: times(_formats(_JPEG_CACHE)["vs_baseline"]),
    "formats.raw_cache_vs_baseline": lambda: f"{_formats(_RAW_CACHE)['vs_baseline']:.1f}x",
    "formats.raw_vs_compact_size": lambda: times(
        _formats(_RAW_CACHE)["kb_per_image"] / _formats(_JPEG_CACHE)["kb_per_image"]
    ),
    "formats.raw_vs_compact_speed": lambda: times(
        _formats(_RAW_CACHE)["images_per_s"] / _formats(_JPEG_CACHE)["images_per_s"]
    ),
    "formats.compact_vs_originals": lambda: times(
        _formats(_JPEG_CACHE)["images_per_s"] / _formats(_ORIGINALS)["images_per_s"]
    ),
    "formats.date": lambda: date_of("scale-formats"),
    "gpu.date": lambda: date_of("gpu"),
    "gpu.pinned_gain": lambda: f"+{100 * (1 / _mechanism('pageable memory (pin_memory=False)')['vs_all_on'] - 1):.0f}%",
    "gpu.device_normalise_gain": lambda: times(
        1 / _mechanism("normalise on the host (float32 over PCIe)")["vs_all_on"]
    ),
    "gpu.channels_last_gain": lambda: times2(1 / _mechanism("contiguous NCHW (channels_last off)")["vs_all_on"]),
    "gpu.prefetch_on": lambda: count(_mechanism("all on")["img_s"]),
    "gpu.prefetch_off": lambda: count(_mechanism("prefetch off (Lightning's copy)")["img_s"]),
    "gpu.folder_fed": lambda: f"{_fed('ImageFolderDataModule'):.2f}",
    "gpu.cache_fed": lambda: f"{_fed('TensorCacheDataModule raw, augment in workers'):.2f}",
    "gpu.recipe_date": lambda: str(result("gpu")["part_settings"]["recipe"]["date"]),
    "gpu.recipe_steps": lambda: str(result("gpu")["part_settings"]["recipe"]["settings"]["steps"]),
    "gpu.recipe_synthetic": lambda: count(result("gpu")["recipe"]["synthetic_img_s"]),
    "gpu.recipe_capped_img_s": lambda: _span([r["img_s"] for r in _threads_ab("auto")], count),
    "gpu.recipe_capped_fed": lambda: _span([_recipe_fed(r["img_s"]) for r in _threads_ab("auto")], "{:.2f}".format),
    "gpu.recipe_uncapped_img_s": lambda: _span([r["img_s"] for r in _threads_ab(None)], count),
    "gpu.recipe_uncapped_fed": lambda: _span([_recipe_fed(r["img_s"]) for r in _threads_ab(None)], "{:.2f}".format),
    "gpu.recipe_threads_gain": lambda: f"{_mean_img_s(_threads_ab('auto')) / _mean_img_s(_threads_ab(None)):.1f}x",
    "gpu.recipe_augment_ms_capped": lambda: _span(
        [r["augment_host_ms_median"] for r in _threads_ab("auto")], "{:.1f}".format
    ),
    "gpu.recipe_augment_ms_uncapped": lambda: _span(
        [r["augment_host_ms_median"] for r in _threads_ab(None)], "{:.0f}".format
    ),
    "gpu.recipe_reference_img_s": lambda: count(result("gpu")["recipe"]["reference"]["img_s"]),
    "gpu.recipe_reference_fed": lambda: f"{_recipe_fed(result('gpu')['recipe']['reference']['img_s']):.2f}",
    "gpu.recipe_vs_reference": lambda: (
        _span(
            [r["img_s"] / result("gpu")["recipe"]["reference"]["img_s"] for r in _threads_ab("auto")], "{:.1f}".format
        )
        + "x"
    ),
    "gpu.recipe_workers_img_s": lambda: count(_recipe_variant("policy-in-workers")["img_s"]),
    "gpu.recipe_workers_fed": lambda: f"{_recipe_variant('policy-in-workers')['fed_ratio']:.2f}",
    "gpu.recipe_workers_vs_reference": lambda: times(
        _recipe_variant("policy-in-workers")["img_s"] / result("gpu")["recipe"]["reference"]["img_s"]
    ),
}


def _threads_ab(host_threads: str | None) -> list[dict[str, Any]]:
    """The GPU recipe's interleaved host-threads A/B rows with this ``host_threads`` setting."""
    return [r for r in result("gpu")["recipe"]["host_threads_ab"]["rows"] if r["host_threads"] == host_threads]


def _recipe_fed(img_s: float) -> float:
    return img_s / result("gpu")["recipe"]["synthetic_img_s"]


def _recipe_variant(name: str) -> dict[str, Any]:
    return _find(result("gpu")["recipe"]["variants"], "variant", name)


def _mean_img_s(rows: list[dict[str, Any]]) -> float:
    return sum(r["img_s"] for r in rows) / len(rows)


def _span(values: list[float], fmt: Callable[[float], str]) -> str:
    """``lo-hi`` of ``values`` as ``fmt`` writes them (one value when they round alike)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A Markdown table: the first column left-aligned, the others right-aligned (numbers)."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def _folder_table() -> str:
    """The README's and the docs home's table: the folder and cache suites of ``latest.json``."""
    data = result("latest")
    rows = [
        ("torchvision `ImageFolder` + classic transforms (baseline)", _folder("baseline (torchvision ImageFolder)")),
        ("`ImageFolderDataModule` (entropy index not built yet)", _folder(_FOLDER)),
        ("`ImageFolderDataModule`, entropy index built", _folder(_INDEXED)),
        ("`TensorCacheDataModule`, augmentation in the workers", _cache(_CACHE_WORKERS)),
        ("`TensorCacheDataModule`, augmentation on the GPU (loader only)", _cache(_CACHE_DEVICE)),
    ]
    caption = (
        f"`fastdata bench` on {machine('latest')}, no GPU ({date_of('latest')}; "
        f"{data['data']['files']:,} photo-like 500x375 JPEGs, 2 workers, batch 64, RandomResizedCrop "
        f"{data['data']['image_size']} + flip, each loader against the torchvision baseline measured in the same "
        "run; `benchmarks/results/latest.json`):"
    )
    table = _table(
        ["loader", "images/s", "vs `torchvision.datasets.ImageFolder` + `DataLoader`"],
        (
            [label, count(r["images_per_s"]), "1.00x" if k == 0 else times(r["vs_baseline"])]
            for k, (label, r) in enumerate(rows)
        ),
    )
    return f"{caption}\n\n{table}"


def _s3_table() -> str:
    """The README's object-storage table: ``s3-folder-pinned-4.json``."""
    name = "s3-folder-pinned-4"
    direct = _s3(_S3_DIRECT)["images_per_s"]
    local = f"{times(_s3_vs(_S3_DIRECT, _S3_LOCAL))} ({times(_s3_vs(_S3_DELAYED, _S3_LOCAL))} with 20 ms per request)"
    rows: list[tuple[str, str, str | None]] = [
        ("`ImageFolderDataModule`, local folder", _S3_LOCAL, local),
        ("per-item `get_object` + PIL + torchvision, from the bucket", _S3_PER_ITEM, None),
        ("LitData 0.2.76 streaming the same bucket", _S3_LITDATA, None),
    ]
    caption = (
        f"`python -m benchmarks.loaders --suites s3 --s3-pin` on {machine(name)} ({date_of(name)}; "
        f"{result(name)['images']:,} photo-like JPEGs in a local SeaweedFS S3 server on one core, the loader on the "
        "other, 2 workers; `benchmarks/results/s3-folder-pinned-4.json`):"
    )
    table = _table(
        ["loader (same run)", "images/s", "ours from the bucket vs it"],
        (
            [label, count(_s3(loader)["images_per_s"]), ratio or times(direct / _s3(loader)["images_per_s"])]
            for label, loader, ratio in rows
        ),
    )
    return f"{caption}\n\n{table}"


def _scan_table() -> str:
    """scale.md's listing table: ``scale.json``'s scan rows."""
    labels = {
        "torchvision ImageFolder(root)": "torchvision `ImageFolder(root)`",
        "scan_image_folder (ImageFolderDataModule.setup)": "`scan_image_folder` (what `setup()` runs)",
        "index_dir, first run (scan + write)": "`index_dir`, first run (scan + write)",
        "index_dir, reuse (stat each folder)": "`index_dir`, reuse (one `stat` per folder)",
    }
    rows = _scale("scan")
    what = (
        f"what ({rows[0]['files']:,} files, warm metadata, fresh process each; {machine('scale')}, {date_of('scale')})"
    )
    return _table(
        [what, "seconds", "vs torchvision", "MB resident"],
        (
            [labels.get(r["what"], r["what"]), f"{r['seconds']:.2f}", f"{r['vs_torchvision']:.2f}x", f"{r['mb']:.0f}"]
            for r in rows
        ),
    )


def _staleness_table() -> str:
    """scale.md's cache-check table: ``scale-staleness.json``."""
    data = result("scale-staleness")
    labels = {
        "files": '`verify_source="files"` (default: one `stat` per file)',
        "folders": '`verify_source="folders"` (one `stat` per folder, a hash of the index)',
    }
    first = data["rows"][0]
    when = date_of("scale-staleness")
    what = f"check of a current cache ({first['files']:,} files in {first['folders']:,} folders; {when})"
    return _table(
        [what, "seconds", "vs every file"],
        (
            [
                labels[r["verify_source"]],
                f"{r['seconds']:.2f}" if r["seconds"] >= 1 else f"{r['seconds']:.3f}",
                f"{r['vs_files']:.3f}x",
            ]
            for r in data["rows"]
        ),
    )


def _formats_table() -> str:
    """scale.md's formats table: ``scale-formats.json``."""
    rows: list[dict[str, Any]] = result("scale-formats")
    labels = {
        "HDF5DataModule compact (--max-side 256, q90)": "HDF5DataModule compact (`--max-side 256 --quality 90`)",
    }
    return _table(
        [f"loader ({date_of('scale-formats')})", "KB per image", "ImageNet GB", "images/s", "vs baseline"],
        (
            [
                labels.get(r["loader"], r["loader"]).replace("storage='jpeg'", '`storage="jpeg"`'),
                f"{r['kb_per_image']:.0f}",
                f"{r['imagenet_gb']:.0f}",
                count(r["images_per_s"]),
                f"{r['vs_baseline']:.2f}x",
            ]
            for r in rows
        ),
    )


def _cold_table() -> str:
    """scale.md's cold-read table: ``scale.json``'s cold_reads rows."""
    rows = _scale("cold_reads")
    header = [f"loader ({date_of('scale')})", "warm img/s", "cold img/s", "cold/warm", "MB read per image"]
    return _table(
        [*header, "MB on disk per image"],
        (
            [
                r["loader"],
                count(r["warm_images_per_s"]),
                count(r["cold_images_per_s"]),
                f"{r['cold_vs_warm']:.2f}",
                f"{r['mb_read_per_image']:.3f}",
                f"{r['mb_on_disk_per_image']:.3f}",
            ]
            for r in rows
        ),
    )


def _matrix_table() -> str:
    """imagefolder.md's JPEG-kinds table: ``jpeg-matrix.json`` (``python -m benchmarks.matrix``)."""
    name = "jpeg-matrix"
    data = result(name)
    settings = data["settings"]
    caption = (
        f"`python -m benchmarks.matrix` on {machine(name)} ({date_of(name)}; per kind "
        f"{settings['files']} generated JPEGs (fewer above 1.5 MP), {settings['workers']} workers, batch "
        f"{settings['batch_size']}, RandomResizedCrop {settings['image_size']} + flip; each loader's images/s over "
        "the full-decode ceiling of the same run: one core reading and decoding every file, times the workers; "
        "`benchmarks/results/jpeg-matrix.json`):"
    )
    rows = []
    for kind in data["kinds"]:
        none, dense, default = kind["rows"]
        share = kind["index_share"]
        rows.append(
            [
                kind["kind"],
                f"{kind['mean_kb']:.0f}",
                times2(none["vs_ceiling"]),
                times2(default["vs_ceiling"]),
                times2(kind["sparse_vs_none"]),
                f"{100 * share['sparse']:.1f}%",
                f"{times2(dense['vs_ceiling'])}, {100 * share['dense']:.1f}%",
            ]
        )
    header = [
        "JPEG kind",
        "KB",
        "no index (epoch 1)",
        "index (epochs 2+)",
        "index vs none",
        "index bytes",
        "one entry per MCU: speed, bytes",
    ]
    return f"{caption}\n\n{_table(header, rows)}"


def _peers_table() -> str:
    """benchmarks.md's peers table: ``peers.json`` (``python -m benchmarks.peers``)."""
    name = "peers"
    data = result(name)
    settings, versions = data["settings"], data["versions"]
    named = ", ".join(f"{peer} {version}" for peer, version in versions.items())
    caption = (
        f"`python -m benchmarks.peers` on {machine(name)} ({date_of(name)}; {named}; "
        f"{settings['workers']} workers or threads each, batch {settings['batch_size']}, RandomResizedCrop "
        f"{settings['image_size']} + flip to uint8; medians of {settings['repeats']} interleaved runs; each cell: "
        "images/s, the ratio to the baseline, and to the full-decode ceiling of the same run (one core reading and "
        "decoding every file, times the workers); `benchmarks/results/peers.json`"
    )
    later = [s["data"] for s in data["sets"] if s.get("note")]
    if later:
        caption += f"; {', '.join(later)}: measured in a second run, see Benchmarks"
    caption += "):"
    loaders = [r["loader"] for r in data["sets"][0]["rows"]]
    header = ["loader", *(f"{s['data']} ({s['files']:,} files, {s['mean_kb']:,.0f} KB)" for s in data["sets"])]
    rows = []
    for loader in loaders:
        cells = []
        for s in data["sets"]:
            r = _find(s["rows"], "loader", loader)
            cells.append(f"{count(r['images_per_s'])} ({times2(r['vs_baseline'])}, {times2(r['vs_ceiling'])})")
        rows.append([loader, *cells])
    rows.append(
        [
            "**ours (epochs 2+) / best peer**",
            *(f"**{times2(s['ours_vs_best_peer'])}** ({s['best_peer']})" for s in data["sets"]),
        ]
    )
    rows.append(["ours (first epoch) / best peer", *(times2(s["first_epoch_vs_best_peer"]) for s in data["sets"])])
    return f"{caption}\n\n{_table(header, rows)}"


def _paced() -> list[dict[str, Any]]:
    """The kinds of the paced background build's run (``first-epoch-paced.json``)."""
    kinds: list[dict[str, Any]] = result("first-epoch-paced")["kinds"]
    return kinds


def _pieces() -> list[dict[str, Any]]:
    """The kinds of the run in which loaders take the index up a finished piece at a time (``first-epoch-pieces``)."""
    kinds: list[dict[str, Any]] = result("first-epoch-pieces")["kinds"]
    return kinds


def _int_range(values: list[int]) -> str:
    """Lowest to highest: ``19-27`` (one value: ``19``)."""
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def _ratio_range(values: list[float], digits: int = 2) -> str:
    """Lowest to highest: ``0.54-0.70x`` (``digits=1``: ``1.6-1.8x``)."""
    ordered = sorted(values)
    return f"{ordered[0]:.{digits}f}-{ordered[-1]:.{digits}f}x"


def _peers_best() -> str:
    """Ours (epochs 2+) over the best peer, lowest to highest over the peers suite's data sets (``1.6-1.8x``)."""
    return _ratio_range([s["ours_vs_best_peer"] for s in result("peers")["sets"]], digits=1)


def _sampling_table() -> str:
    """The Sampling page's table: the sampler at 1.28M and 10M samples, ``sampling.json``."""
    data = result("sampling")
    caption = (
        f"`python -m benchmarks.sampling` on {machine('sampling')} ({date_of('sampling')}; 1,000 classes with a 1:100 "
        "skew; one epoch's draw and this rank's keys on one of 8 ranks; memory: numpy's allocations as `tracemalloc` "
        "counts them, the plain epoch's `torch.randperm` not counted; kept: the epoch's draws, besides the weights' "
        "cumulative sum kept from the set-up, 8 bytes a sample; `benchmarks/results/sampling.json`):"
    )
    table = _table(
        ["samples", "setting", "set-up (once a run)", "draw (once an epoch)", "peak while drawing", "kept"],
        (
            [
                f"{r['samples']:,}",
                r["setting"],
                f"{r['setup_s']:.2f} s",
                f"{r['draw_s']:.2f} s",
                f"{r['draw_peak_mb']:.0f} MB",
                f"{r['kept_mb']:.0f} MB",
            ]
            for r in data["sampler"]
        ),
    )
    return f"{caption}\n\n{table}"


def _sampling_predicted(what: str) -> Any:
    return result("sampling")["predicted"][what]


def _sampling_row(samples: int, setting: str) -> dict[str, Any]:
    return next(r for r in result("sampling")["sampler"] if r["samples"] == samples and r["setting"] == setting)


#: Every named block: a function of the results files giving its Markdown.
BLOCKS: dict[str, Callable[[], str]] = {
    "segmentation-table": _segmentation_table,
    "sampling-table": _sampling_table,
    "folder-table": _folder_table,
    "s3-table": _s3_table,
    "scale-scan-table": _scan_table,
    "scale-staleness-table": _staleness_table,
    "scale-formats-table": _formats_table,
    "scale-cold-table": _cold_table,
    "matrix-table": _matrix_table,
    "peers-table": _peers_table,
}

_INLINE = re.compile(r"<!--fig:([\w.-]+)-->(.*?)<!--/fig-->", re.S)
_BLOCK = re.compile(r"(<!--figures:([\w.-]+)-->\n)(.*?)(\n<!--/figures-->)", re.S)


#: A measured ratio as the pages print one (``2.9x``, ``0.94x``, ``18x``).
_RATIO = re.compile(r"\b(\d+\.\d+|[1-9]\d+)x\b")
_FENCE = re.compile(r"```.*?```", re.S)


def _named(table: dict[str, Callable[[], str]], kind: str, name: str, where: str) -> str:
    """The latest text of figure or block ``name``; a ``KeyError`` naming the page if there is none."""
    if name not in table:
        raise KeyError(f"{where}: no {kind} {name!r}; the {kind}s are {', '.join(sorted(table))}")
    return table[name]()


def render(text: str, where: str = "a page") -> str:
    """``text`` with every marked figure and block set to the latest results.

    Raises:
        KeyError: A marker names a figure or block that does not exist (the message names the page).
    """
    text = _BLOCK.sub(lambda m: f"{m[1]}{_named(BLOCKS, 'block', m[2], where)}{m[4]}", text)
    return _INLINE.sub(lambda m: f"<!--fig:{m[1]}-->{_named(FIGURES, 'figure', m[1], where)}<!--/fig-->", text)


def hand_typed(text: str) -> list[str]:
    """The measured ratios ``text`` types by hand: outside the markers and outside code blocks (program output)."""
    return [m[0] for m in _RATIO.finditer(_FENCE.sub("", _INLINE.sub("", _BLOCK.sub("", text))))]


def check(pages: Iterable[str] = PAGES) -> list[str]:
    """One line per marked figure or block of ``pages`` that is not the latest result's, and per ratio typed by
    hand outside the markers (empty: all current)."""
    stale = []
    for page in pages:
        text = (REPO / page).read_text()
        for m in _INLINE.finditer(text):
            want = _named(FIGURES, "figure", m[1], page)
            if m[2] != want:
                stale.append(f"{page}: {m[1]} is {m[2]!r}, the latest result gives {want!r}")
        for m in _BLOCK.finditer(text):
            if m[3] != _named(BLOCKS, "block", m[2], page):
                stale.append(f"{page}: the block {m[2]!r} is not the latest result's")
        stale += [f"{page}: {ratio} typed by hand (name it in benchmarks/figures.py)" for ratio in hand_typed(text)]
    return stale


def write(pages: Iterable[str] = PAGES) -> list[str]:
    """Rewrite the marked figures and blocks of ``pages``; return the pages changed."""
    changed = []
    for page in pages:
        path = REPO / page
        text = path.read_text()
        new = render(text, page)
        if new != text:
            path.write_text(new)
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages' figures from the results files")
    parser.add_argument(
        "--check", action="store_true", help="list stale or hand-typed figures; exit 1 if any (the default)"
    )
    args = parser.parse_args(argv)
    if args.write:
        for page in write():
            print(f"updated {page}")
        return 0
    stale = check()
    for line in stale:
        print(line)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
