"""Interleaved A/B of the folder loader and the tensor-cache build: an older revision vs this checkout.

Issue 26's before/after, measured in one run on the same VM: the older revision is checked out in a temporary git
worktree with its own build of the ROI decoder, and each round runs ``python -m lightning_fastdata.bench.loaders
--suites folder`` (2 workers, one repeat) in both trees, alternating which goes first, on each data set and output
size; then each tree builds the raw tensor cache of the same folder (2 processes) and is timed. Ratios to the
baseline and to the full-decode ceiling come from the same process as the row they divide.

    python -m benchmarks.ab_decode --old acdba2f --rounds 3 --json benchmarks/results/ab-decode.json

Data sets: ``data/bench`` (1,536 photo-like 500x375 JPEGs, the benchmark's) at 224 and 112 px, and
``data/bench-large`` (768 photo-like 1000x750 JPEGs, generated if missing) at 224 px.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import REPO, old_worktree, record


def _run_suite(tree: Path, root: str, size: int, out: Path) -> list[dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "lightning_fastdata.bench.loaders", "--root", root, "--suites", "folder",
        "--workers", "2", "--repeats", "1", "--image-size", str(size), "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    ceiling = max(result["decode_ceiling_1core"].values()) * 2
    return [{**r, "vs_ceiling": r["images_per_s"] / ceiling} for r in result["suites"]["folder"]]


_BUILD = """
import sys, time
from lightning_fastdata import TensorCacheDataModule
dm = TensorCacheDataModule(sys.argv[1], sys.argv[2], val_fraction=0.0, build_processes=2, num_workers=0)
start = time.perf_counter()
dm.prepare_data()
print(time.perf_counter() - start)
"""


def _time_build(tree: Path, root: str, scratch: Path) -> float:
    cache = scratch / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _BUILD, str(Path(root).resolve()), str(cache)],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    files = sum(1 for _ in Path(root).rglob("*.jpg"))
    return float(out.stdout.strip().splitlines()[-1]) * 1000 / files


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True, help="the revision to compare with (a commit, tag or branch)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from lightning_fastdata.demos import make_image_folder

    if not Path("data/bench-large").exists():
        make_image_folder(Path("data/bench-large"), num_classes=4, per_class=192, size=(1000, 750), processes=2)
    if not Path("data/bench").exists():
        make_image_folder(Path("data/bench"), num_classes=8, per_class=192, size=(500, 375), processes=2)
    cases = [("data/bench", 224), ("data/bench", 112), ("data/bench-large", 224)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastdata-ab-") as tmp, old_worktree(args.old, Path(tmp)) as old:
        trees = {"old": old, "new": REPO}
        for k in range(args.rounds):
            order = ["old", "new"] if k % 2 == 0 else ["new", "old"]
            for root, size in cases:
                for version in order:
                    got = _run_suite(trees[version], os.path.abspath(root), size, Path(tmp) / "r.json")
                    for r in got:
                        rows.append({"version": version, "round": k, "data": root, "size": size, **r})
                    print(version, root, size, [(r["loader"], round(r["images_per_s"])) for r in got], flush=True)
            for version in order:
                ms = _time_build(trees[version], "data/bench", Path(tmp))
                rows.append({"version": version, "round": k, "data": "data/bench", "build_ms_per_image": ms})
                print(version, "cache build", round(ms, 3), "ms/image", flush=True)
    summary: dict[str, Any] = {}
    for root, size in cases:
        for version in ("old", "new"):
            for loader in sorted({r["loader"] for r in rows if r.get("size") == size and r["data"] == root}):
                sel = [r for r in rows if r.get("size") == size and r["data"] == root and r["version"] == version
                       and r["loader"] == loader]  # fmt: skip
                if sel:
                    summary[f"{root} {size}px {version}: {loader}"] = {
                        "images_per_s": statistics.median(r["images_per_s"] for r in sel),
                        "vs_baseline": statistics.median(r["vs_baseline"] for r in sel),
                        "vs_2core_decode_ceiling": statistics.median(r["vs_ceiling"] for r in sel),
                    }
    for version in ("old", "new"):
        summary[f"cache build {version} (ms per image, 2 processes)"] = statistics.median(
            r["build_ms_per_image"] for r in rows if "build_ms_per_image" in r and r["version"] == version
        )
    for key, value in summary.items():
        print(key, value)
    what = f"interleaved A/B, {args.old} (old) vs this checkout (new), {args.rounds} rounds, medians"
    return record(args.json, what=what, summary=summary, runs=rows)


if __name__ == "__main__":
    main()
