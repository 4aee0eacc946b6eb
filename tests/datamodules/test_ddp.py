from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.fork_client import SERVER, rank_procs

from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3_server import LocalS3, free_ports
from lightning_fastdata import convert_folder_to_hdf5, scan_image_folder
from lightning_fastdata.demos import make_image_folder

#: Two simulated nodes' script, started at once from the tests' fork server (``helpers/zygote.py``).
NODE_FIT = Path(__file__).parents[1] / "helpers" / "node_fit.py"


@pytest.mark.timeout(300)
# workers=0 shards through the same sampler (covered by test_sampler.py and the resume tests)
@pytest.mark.slow
def test_two_process_ddp_ranks_get_disjoint_halves(tmp_path: Path) -> None:
    """Each DataModule kind in turn, in one two-process launch (a launch costs ~12 s of imports and start-up)."""
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=10, size=(32, 24))
    h5 = convert_folder_to_hdf5(root, tmp_path / "d.h5", processes=1, progress=False)
    kinds = {"folder": root, "hdf5": h5, "cache": root}
    script = Path(__file__).parents[1] / "helpers" / "ddp_fit.py"
    # Lightning's own launcher, as users run it (it starts rank 1 as a fresh script): the one test that keeps it, the
    # other 2-rank runs fork from the tests' fork server
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0])}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "2", *(f"{k}={v}" for k, v in kinds.items())],
        capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    # the cache's prepare_data ran on local rank 0 only; rank 1 waited, then opened the same cache
    assert out.stdout.count("building the tensor cache") == 1, out.stdout
    labels = scan_image_folder(str(root)).labels
    for kind in kinds:
        ranks = [json.loads((tmp_path / f"rank{r}-{kind}.json").read_text()) for r in (0, 1)]
        assert all(r["world"] == 2 for r in ranks), kind
        a, b = (set(r["indices"]) for r in ranks)
        assert len(a) == len(b) == 10 and not a & b and a | b == set(range(20)), kind
        for r in ranks:  # what the model received is exactly this rank's shard
            assert sorted(r["labels"]) == sorted(int(labels[i]) for i in r["indices"]), kind


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("kind", "per_node"), [("cache", True), ("folder", False)])
@pytest.mark.slow
def test_two_nodes_scan_and_build_once_per_node_or_once_in_total(tmp_path: Path, kind: str, per_node: bool) -> None:
    """2 simulated nodes x 1 rank: node-local dirs with prepare_data_per_node, one shared dir without."""
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=6, size=(32, 24))
    past = time.time() - 60  # older than the racy window, as real data is
    for d in [root, *root.iterdir()]:
        os.utime(d, (past, past))
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0]), "WORLD_SIZE": "2"}
    procs = []
    for node in (0, 1):
        local = tmp_path / (f"node{node}" if per_node else "shared")
        args = [str(root), str(tmp_path), str(node), kind, str(local / "index"), str(local / "cache")]
        procs.append({"env": {"NODE_RANK": str(node), "LOCAL_RANK": "0"}, "argv": [*args, "1" if per_node else "0"]})
    code, out = SERVER.command([str(NODE_FIT)], tmp_path, tmp_path / "nodes.log", env=env, procs=procs)
    assert code == 0, out[-6000:]
    nodes = [json.loads((tmp_path / f"node{k}.json").read_text()) for k in (0, 1)]
    assert [n["global_rank"] for n in nodes] == [0, 1] and all(n["world"] == 2 for n in nodes)
    for k, node in enumerate(nodes):
        lookups = [e for e in node["events"] if e["event"] == "index"]
        builds = [e for e in node["events"] if e["event"] == "cache"]
        prepares = per_node or k == 0  # Lightning runs prepare_data on these; the other rank waits
        assert all(e["files"] == 12 for e in lookups) and all(e["why"] is None for e in lookups)
        assert [e["reused"] for e in lookups] == (
            ([False] if prepares else []) + ([True] if kind == "folder" else [])  # the cache's setup opens the cache
        )
        assert [e["existed"] for e in builds] == ([False] if prepares and kind == "cache" else [])
    dirs = ["node0", "node1"] if per_node else ["shared"]
    for d in dirs:  # one index per folder written where prepare_data ran, no temporary file left
        assert [p.name.endswith(".fdindex.npz") for p in (tmp_path / d / "index").iterdir()] == [True]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_ranks_build_a_cache_from_a_bucket_once(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    """A node's 2 DDP ranks: local rank 0 builds the cache from the bucket (each object fetched once), rank 1 waits."""
    script = Path(__file__).parents[1] / "helpers" / "ddp_fit.py"
    with fault_proxy(s3.endpoint) as proxy:  # counts the requests; configured by the environment, as users do
        code, out = SERVER.command([str(script), str(tmp_path), "2", f"cache={s3_image_folder}"], tmp_path,
                                   tmp_path / "fit.log", env=s3.env(proxy.endpoint), procs=rank_procs(2))  # fmt: skip
        gets = [path for method, path, status in proxy.requests() if method == "GET" and path.endswith(".jpg")]
    assert code == 0, out[-4000:]
    assert out.count("building the tensor cache") == 1, out
    images = sorted(str(p.relative_to(image_folder)) for p in image_folder.rglob("*.jpg"))
    assert len(gets) == len(set(gets)) == len(images)  # every object once, by one rank's build
    labels = scan_image_folder(str(image_folder)).labels
    ranks = [json.loads((tmp_path / f"rank{r}-cache.json").read_text()) for r in (0, 1)]
    a, b = (set(r["indices"]) for r in ranks)
    assert a | b == set(range(len(images))) and len(a & b) == len(images) % 2  # the sampler pads an odd count
    for r in ranks:
        assert sorted(r["labels"]) == sorted(int(labels[i]) for i in r["indices"])
    assert s3.secret_access_key not in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("per_node", [False, True])
@pytest.mark.slow
def test_two_nodes_build_a_cache_from_a_bucket_once_in_total_or_once_per_node(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path, per_node: bool
) -> None:
    """2 simulated nodes x 1 rank on ``s3://``: a shared cache_dir is built once in total (each object fetched once,
    ``prepare_data_per_node=False``), node-local ones once per node (each object fetched once by each node)."""
    images = sorted(str(p.relative_to(image_folder)) for p in image_folder.rglob("*.jpg"))
    with fault_proxy(s3.endpoint) as proxy:  # counts the requests; configured by the environment
        env = {**s3.env(proxy.endpoint), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0])}
        env["WORLD_SIZE"] = "2"
        procs = []
        for node in (0, 1):
            local = tmp_path / (f"node{node}" if per_node else "shared")
            args = [s3_image_folder, str(tmp_path), str(node), "cache", str(local / "index"), str(local / "cache")]
            procs.append(
                {"env": {"NODE_RANK": str(node), "LOCAL_RANK": "0"}, "argv": [*args, "1" if per_node else "0"]}
            )
        code, out = SERVER.command([str(NODE_FIT)], tmp_path, tmp_path / "nodes.log", env=env, procs=procs)
        gets = [path for method, path, status in proxy.requests() if method == "GET" and path.endswith(".jpg")]
    assert code == 0, out[-6000:]
    nodes = [json.loads((tmp_path / f"node{k}.json").read_text()) for k in (0, 1)]
    builds = [[e["existed"] for e in n["events"] if e["event"] == "cache"] for n in nodes]
    assert builds == ([[False], [False]] if per_node else [[False], []])  # node 1 waits for node 0's build
    copies = 2 if per_node else 1
    assert sorted(gets) == sorted(f"/{s3.bucket}/train/{name}" for name in images for _ in range(copies))
    for d in ["node0", "node1"] if per_node else ["shared"]:
        assert (tmp_path / d / "cache" / "manifest.json").exists()
    assert s3.secret_access_key not in out


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_evaluation_on_two_ranks_equals_one_rank_and_sees_every_sample_once(tmp_path: Path) -> None:
    """63 test images, 2 ranks, batch 4 (neither divides it): every image on exactly one rank, and ``validate`` and
    ``test`` give one rank's loss and accuracy (a padded shard would count one image twice: 64 samples), for the
    folder module and the HDF5 module (``val_root``/``test_root``: folders, files); ``predict`` writes
    one rank's table (``PredictionWriter`` merges the ranks' rows in input order). The same for flat folders
    labelled by one multi-label table: ``val_map``/``val_f1`` over every rank's gathered scores equal one rank's."""
    root = make_image_folder(tmp_path / "train", num_classes=3, per_class=4, size=(32, 24))
    test_root = make_image_folder(tmp_path / "test", num_classes=3, per_class=21, size=(32, 24), seed=5)
    train_h5 = convert_folder_to_hdf5(root, tmp_path / "train.h5", processes=1, progress=False)
    test_h5 = convert_folder_to_hdf5(test_root, tmp_path / "test.h5", processes=1, progress=False)
    rows = []
    for name, src in (("flat_train", root), ("flat_test", test_root)):
        (tmp_path / name).mkdir()
        for k, image in enumerate(sorted(src.rglob("*.jpg"))):
            shutil.copy(image, tmp_path / name / f"{name}_{k:02d}.jpg")
            rows.append([f"{name}_{k:02d}", f"{image.parent.name} {'odd' if k % 2 else 'even'}"])
    with open(tmp_path / "labels.csv", "w", newline="") as f:
        csv.writer(f).writerows([["id", "tags"], *rows])
    script = Path(__file__).parents[1] / "helpers" / "ddp_eval.py"
    for devices in ("1", "2"):
        args = [str(tmp_path), devices, str(root), str(test_root), str(test_h5), str(train_h5)]
        args += [str(tmp_path / "flat_train"), str(tmp_path / "flat_test"), str(tmp_path / "labels.csv")]
        # forked from the tests' fork server (the imports paid once); two ranks told theirs as torchrun does, on
        # their own port (two DDP runs of parallel test workers must never meet)
        procs = rank_procs(2) if devices == "2" else None
        code, log = SERVER.command([str(script), *args], tmp_path, tmp_path / f"eval-{devices}.log", procs=procs)
        assert code == 0, log[-4000:]
    one = json.loads((tmp_path / "eval-1-rank0.json").read_text())
    two = [json.loads((tmp_path / f"eval-2-rank{r}.json").read_text()) for r in (0, 1)]
    for kind in ("folder", "hdf5", "table"):
        for stage in ("validate", "test"):
            shares = [r[f"{kind} served"][stage] for r in two]
            assert sorted(shares[0] + shares[1]) == list(range(63)), (kind, stage)  # each once, none padded
            assert sorted(one[f"{kind} served"][stage]) == list(range(63))
            metrics = one[f"{kind} {stage}"]
            prefix = "val" if stage == "validate" else "test"
            names = ("_loss", "_map", "_f1") if kind == "table" else ("_loss", "_acc")
            assert {prefix + name for name in names} <= metrics.keys(), metrics
            for r in two:  # both ranks report the synced value
                for name, value in metrics.items():
                    assert abs(r[f"{kind} {stage}"][name] - value) < 1e-5, (kind, stage, name)
        # the prediction table: every image once, in path order, the same classes and probabilities
        tables = [list(csv.reader(open(tmp_path / f"pred-{d}-{kind}.csv", newline=""))) for d in ("1", "2")]
        assert len(tables[0]) == 64 and [r[:2] + r[3:4] for r in tables[0]] == [r[:2] + r[3:4] for r in tables[1]]
        for a, b in zip(tables[0][1:], tables[1][1:]):
            assert abs(float(a[2]) - float(b[2])) < 1e-4 and abs(float(a[4]) - float(b[4])) < 1e-4
