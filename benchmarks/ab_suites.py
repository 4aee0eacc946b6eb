"""Interleaved A/B of whole ``fastdata bench`` suites: an older revision vs this checkout, same data, same VM.

What a refactor must show (issue 37: "the same behaviour and speed, A/B against today's main in one interleaved
run"): the older revision is checked out in a temporary git worktree with its own build of the JPEG extension;
each round runs ``fastdata bench --suites ...`` in both trees, alternating which goes first, on the same
``--root``; every row's median over the rounds is printed beside the other tree's, with the range.

    python -m benchmarks.ab_suites --old 94e8486 --suites folder cache hdf5 --rounds 3 --json ab.json
    python -m benchmarks.ab_suites --old 94e8486 --suites s3 --s3-pin --rounds 2

Rows are compared by name; a row only one tree has is listed without a ratio. The machine is shared and noisy
(run-to-run spread of ~5% here): read a ratio together with the ranges.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import REPO, old_worktree, record


def _rows(result: dict[str, Any]) -> dict[str, float]:
    """``suite | loader | N workers`` -> images/s of one ``fastdata bench --json`` result."""
    out: dict[str, float] = {}
    for suite, rows in result["suites"].items():
        if isinstance(rows, dict):  # the s3 suite nests its rows with its own settings
            rows = rows.get("rows", [])
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("images_per_s"), (int, float)):
                out[f"{suite} | {row['loader']} | {row.get('num_workers', '?')} workers"] = float(row["images_per_s"])
    return out


def _bench(tree: Path, args: argparse.Namespace, scratch: Path, out: Path) -> dict[str, float]:
    # the harness with the lab's suites in either tree (before the lab moved out, benchmarks.loaders wrapped it)
    cmd = [sys.executable, "-m", "benchmarks.loaders", "--root", os.path.abspath(args.root)]
    cmd += ["--suites", *args.suites, "--workers", "2", "--repeats", str(args.repeats), "--json", str(out)]
    cmd += ["--scratch", str(scratch)] + (["--s3-pin"] if args.s3_pin else [])
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return _rows(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True, help="the revision to compare with (a commit, tag or branch)")
    p.add_argument("--suites", nargs="+", default=["folder", "cache", "hdf5"])
    p.add_argument("--root", default="data/bench", help="image folder (fastdata bench generates it if missing)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="fastdata bench --repeats inside each round")
    p.add_argument("--s3-pin", action="store_true", help="s3 suite: the loader on one CPU, the server on another")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastdata-ab-") as tmp, old_worktree(args.old, Path(tmp)) as old:
        trees = {"old": old, "new": REPO}
        for k in range(args.rounds):
            for version in ["old", "new"] if k % 2 == 0 else ["new", "old"]:
                # each tree and round its own scratch: an older tree's shards suite refuses to write over its shards
                scratch = Path(tmp) / f"scratch-{version}-{k}"
                got = _bench(trees[version], args, scratch, Path(tmp) / "r.json")
                runs.append({"version": version, "round": k, "rows": got})
                print(version, k, {name: round(v) for name, v in got.items()}, flush=True)
    summary: dict[str, Any] = {}
    names = sorted({name for run in runs for name in run["rows"]})
    for name in names:
        per = {v: [r["rows"][name] for r in runs if r["version"] == v and name in r["rows"]] for v in ("old", "new")}
        entry: dict[str, Any] = {
            v: {"median": statistics.median(x), "range": [min(x), max(x)]} for v, x in per.items() if x
        }
        if per["old"] and per["new"]:
            entry["new_vs_old"] = statistics.median(per["new"]) / statistics.median(per["old"])
        summary[name] = entry
        ratio = f"{entry['new_vs_old']:.3f}" if "new_vs_old" in entry else "-"
        print(
            f"{name}: "
            + ", ".join(
                f"{v} {e['median']:.0f} {[round(x) for x in e['range']]}"
                for v, e in entry.items()
                if v in ("old", "new")
            )
            + f", new/old {ratio}"
        )
    what = f"interleaved A/B of fastdata bench {' '.join(args.suites)}: {args.old} (old) vs this checkout (new)"
    return record(args.json, what=what, rounds=args.rounds, repeats=args.repeats, summary=summary, runs=runs)


if __name__ == "__main__":
    main()
