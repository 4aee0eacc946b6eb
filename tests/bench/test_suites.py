"""The benchmark harness runs end to end from one command and reports what it measured (no speed asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_fastdata.bench.loaders import main


def test_bench_folder_suite_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "latest.json"
    result = main(
        [
            "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "12", "--suites", "folder",
            "--workers", "0", "2", "--batch-size", "4", "--image-size", "32", "--repeats", "1",
            "--min-seconds", "0", "--json", str(out),
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "| baseline (torchvision ImageFolder) | 2 |" in printed and "| ImageFolderDataModule | 2 |" in printed
    saved = json.loads(out.read_text())
    rows = saved["suites"]["folder"]
    assert [(r["loader"], r["num_workers"]) for r in rows][:2] == [
        ("baseline (torchvision ImageFolder)", 0),
        ("ImageFolderDataModule", 0),
    ]
    assert len(rows) == 10 and all(r["images_per_s"] > 0 for r in rows)
    assert "| ImageFolderDataModule (exact_decode=True) | 2 |" in printed
    assert "| ImageFolderDataModule (entropy_index=True) | 2 |" in printed  # its index built before timing
    assert rows[0]["vs_baseline"] == 1.0 and result["data"]["files"] == 24
    from benchmarks.ab_suites import _rows  # the A/B harness reads what fastdata bench writes, row by row

    ours = next(r for r in rows if r["loader"] == "ImageFolderDataModule" and r["num_workers"] == 2)
    assert _rows(saved)["folder | ImageFolderDataModule | 2 workers"] == ours["images_per_s"]


@pytest.mark.slow
def test_scale_suite_measures_a_linked_tree_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The scale suite on a small tree (a lab suite: ``python -m benchmarks.loaders``): every table printed, figures
    consistent with what was built; ``fastdata bench`` (the installed harness) does not offer it."""
    from benchmarks.loaders import main as lab_main

    with pytest.raises(SystemExit):
        main(["--suites", "scale"])
    result = lab_main(
        [
            "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "16", "--suites", "scale",
            "--scale-root", str(tmp_path / "tree"), "--scale-classes", "3", "--scale-per-class", "7",
            "--scale-epochs", "2", "--scale-batches", "1", "--batch-size", "8", "--image-size", "32",
            "--repeats", "1", "--min-seconds", "0", "--scale-doctor-seconds", "1",
        ]
    )  # fmt: skip
    scale = result["suites"]["scale"]
    tree = tmp_path / "tree"
    assert sorted(p.name for p in tree.iterdir()) == [".fastdata-linked-tree", "n00000000", "n00000001", "n00000002"]
    first = tree / "n00000001" / "n00000001_0.JPEG"
    assert first.stat().st_nlink == 7 and (tree / "n00000001" / "n00000001_6.JPEG").samefile(first)
    assert [r["files"] for r in scale["scan"]] == [21] * 4  # torchvision, ours, first index run, reuse
    checks = {r["verify_source"]: r for r in scale["staleness_check"]}
    assert sorted(checks) == ["files", "folders"]
    assert all(r["files"] == 21 and r["folders"] == 4 for r in checks.values())  # the root and its 3 classes
    assert not list(tmp_path.glob("*manifest-only-cache*"))  # its stand-in cache is removed
    assert [r["loader"] for r in scale["worker_pss"]] == ["torchvision", "ours"]
    assert all(len(r["worker_pss_mb_per_epoch"]) == 2 for r in scale["worker_pss"])
    cold = {r["loader"]: r for r in scale["cold_reads"]}
    assert len(cold) == 7 and all(r["cold_images_per_s"] > 0 for r in cold.values())
    folder_kb = cold["ImageFolderDataModule"]["mb_on_disk_per_image"]
    assert folder_kb == pytest.approx(cold["HDF5DataModule encoded"]["mb_on_disk_per_image"], rel=0.05)
    formats = {r["loader"]: r for r in scale["formats"]}
    compact = formats["HDF5DataModule compact (--max-side 256, q90)"]["kb_per_image"]
    assert compact < formats["ImageFolderDataModule (original JPEGs)"]["kb_per_image"]  # 500x375 -> 341x256
    assert compact < formats["TensorCacheDataModule (256 px uint8)"]["kb_per_image"] / 3
    printed = capsys.readouterr().out
    assert scale["doctor"]["files"] == 21 and scale["doctor"]["sampled"] == 21
    for title in (
        "Suite scale: index of 21 files",
        "Worker PSS",
        "Cold reads",
        "Formats of the same",
        "`fastdata doctor`",
    ):
        assert title in printed
    with pytest.raises(FileExistsError, match="not empty"):  # never builds into a folder it did not make
        lab_main(["--root", str(tmp_path / "bench"), "--suites", "scale", "--scale-root", str(tmp_path / "bench")])


def test_bench_builds_its_files_in_scratch_and_leaves_nothing_beside_the_data(tmp_path: Path) -> None:
    """Before: the HDF5 and cache suites left ``<root>-raw256.h5``, ``-encoded.h5``, ``-seed.h5``, a cache folder and
    its ``.lock`` beside the folder. Now they go to a temporary folder, removed, or to ``--scratch``, kept."""
    from lightning_fastdata.demos import make_image_folder

    user = make_image_folder(tmp_path / "data" / "mine", num_classes=2, per_class=5, size=(64, 48))
    beside = sorted(p.name for p in user.parent.iterdir())
    small = ["--suites", "hdf5", "cache", "--workers", "0", "--batch-size", "4", "--image-size", "32"]
    small += ["--repeats", "1", "--min-seconds", "0"]
    main(["--root", str(user), *small])
    assert sorted(p.name for p in user.parent.iterdir()) == beside
    scratch = tmp_path / "scratch"
    main(["--root", str(user), "--scratch", str(scratch), *small])
    assert sorted(p.name for p in user.parent.iterdir()) == beside
    assert {"mine-raw256.h5", "mine-encoded.h5", "mine-seed.h5", "mine-cache256"} <= {p.name for p in scratch.iterdir()}


@pytest.mark.timeout(300)
def test_bench_recipe_suite_times_the_reference_loader_and_ours_with_a_users_config(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(
        """
data:
  class_path: lightning_fastdata.ImageFolderDataModule
  init_args:
    root: data/train
    image_size: 40
    device_transforms:
      - class_path: lightning_fastdata.augment.RandAugment
        init_args: {num_ops: 2, magnitude: 9}
    batch_transforms:
      - class_path: lightning_fastdata.augment.RandomErasing
        init_args: {p: 0.25}
      - class_path: torchvision.transforms.v2.MixUp
        init_args: {alpha: 0.2}
"""
    )
    result = main(
        [
            "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "16", "--suites", "recipe",
            "--recipe", str(config), "--workers", "2", "--batch-size", "8", "--repeats", "1", "--min-seconds", "0",
        ]
    )  # fmt: skip
    suite = result["suites"]["recipe"]
    names = [r["loader"] for r in suite["rows"]]
    assert names[0] == "torchvision reference loader" and len(names) == 7  # with the two entropy-index rows
    assert "ours, policy in workers, entropy_index=True (loader only)" in names
    assert all(r["images_per_s"] > 0 and r["num_workers"] == 2 for r in suite["rows"])
    assert suite["device_ops_ms_per_batch_cpu"] > 0


def test_a_recipe_is_read_from_a_config_as_objects() -> None:
    from torchvision.transforms import v2

    from lightning_fastdata.augment import TrivialAugmentWide
    from lightning_fastdata.recipe import load_recipe, reference_loader

    recipe, written = load_recipe("recipe_torchvision")
    assert recipe["image_size"] == 176 and recipe["repeated_augmentations"] == 4
    assert isinstance(recipe["device_transforms"][0], TrivialAugmentWide)
    assert isinstance(recipe["batch_transforms"][1], v2.RandomChoice)
    assert written["device_transforms"][0]["class_path"] == "lightning_fastdata.augment.TrivialAugmentWide"
    with pytest.raises(Exception, match="nope"):
        load_recipe("nope")
    assert callable(reference_loader)


def test_the_jpeg_matrix_measures_each_kind_with_and_without_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks.matrix``: each kind generated as asked (size, restart markers), its
    three loaders and ceiling measured, and each index's share of the bytes: the dense one 4x the default's or
    more, the default's within its 1.5%."""
    from PIL import Image

    from benchmarks import matrix

    kinds = ["photo 256x192 q75", "photo 640x480 q90 restarts"]
    out = tmp_path / "matrix.json"
    result = matrix.main(
        ["--kinds", *kinds, "--files", "16", "--workers", "0", "--batch-size", "4", "--image-size", "32",
         "--repeats", "1", "--min-seconds", "0", "--scratch", str(tmp_path / "s"), "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    printed = capsys.readouterr().out
    assert [r["kind"] for r in result["kinds"]] == kinds and "| photo 640x480 q90 restarts |" in printed
    restarts = next((tmp_path / "s" / "data").glob("*restarts/class_0/*.jpg"))
    with Image.open(restarts) as image:
        assert image.size == (640, 480) and image.info.get("dri") or b"\xff\xdd" in restarts.read_bytes()
    for kind in result["kinds"]:
        assert kind["files"] == 16 and kind["ceiling_img_s"] > 0
        assert [r["images_per_s"] > 0 for r in kind["rows"]] == [True, True, True]
        share = kind["index_share"]
        assert 0 < share["sparse"] <= 0.015 and share["dense"] > 4 * share["sparse"]


@pytest.mark.slow
def test_the_peers_suite_measures_ours_beside_each_peer_that_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks.peers``: the demo's data and a matrix kind, the baseline and ours
    (first epoch, and with the index built) measured, each peer measured where it imports and named as skipped
    where it does not, the best peer's ratio only where one ran, the JSON as returned."""
    import importlib.util

    from benchmarks import peers

    out = tmp_path / "peers.json"
    result = peers.main(
        ["--root", str(tmp_path / "demo"), "--kinds", "photo 640x480 q90 restarts", "--files", "16", "--workers",
         "0", "--batch-size", "4", "--image-size", "32", "--repeats", "1", "--min-seconds", "0",
         "--scratch", str(tmp_path / "s"), "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    printed = capsys.readouterr().out
    assert [s["data"] for s in result["sets"]] == [peers.DEMO, "photo 640x480 q90 restarts"]

    def imports(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            return False

    here = [p for p, module in peers.PEERS.items() if imports(module.split(".")[0]) and peers.available(p)]
    for s in result["sets"]:
        assert s["files"] == 16 and s["ceiling_img_s"] > 0
        names = [r["loader"] for r in s["rows"]]
        assert names == [
            "baseline (torchvision ImageFolder)",
            "ImageFolderDataModule (first epoch)",
            "ImageFolderDataModule (epochs 2+)",
            *here,
        ]
        assert all(r["images_per_s"] > 0 and r["vs_ceiling"] > 0 for r in s["rows"])
        assert s["skipped"] == [p for p in peers.PEERS if p not in here]
        assert (s["ours_vs_best_peer"] is None) == (not here)
    for peer in set(peers.PEERS) - set(here):
        assert f"bench peers: {peer} does not import here" in printed
    assert (tmp_path / "s" / "demo" / "entropy-index").is_dir()  # ours' index built in scratch, not beside the data


def test_the_peers_crop_box_follows_torchvisions_random_resized_crop() -> None:
    """The box SPDL's row crops (its FFmpeg filter needs it before decoding; the package's own random_resized_crop_box):
    inside the image, scale 0.08-1 and ratio 3/4-4/3 as torchvision draws them (up to rounding), and torchvision's
    centre crop when no try fits."""
    import numpy as np
    import torch
    from torchvision.transforms import RandomResizedCrop

    from lightning_fastdata.augment.geometry import CROP_DRAWS, random_resized_crop_box

    rng = np.random.default_rng(0)
    for width, height in [(500, 375), (64, 480), (2000, 1500), (33, 31)]:
        for _ in range(200):
            y, x, h, w = random_resized_crop_box(rng.random(CROP_DRAWS), width, height)
            assert 0 <= x and x + w <= width and 0 <= y and y + h <= height and w > 0 and h > 0
            assert 0.08 * width * height - width - height <= w * h <= width * height
    for width, height in [(1000, 10), (10, 1000)]:  # no try fits: torchvision's fallback, exactly
        top, left, h, w = RandomResizedCrop.get_params(torch.empty(0, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
        assert random_resized_crop_box(rng.random(CROP_DRAWS), width, height) == (top, left, h, w)


@pytest.mark.slow
def test_the_first_epoch_measurement_times_the_default_module_while_its_index_is_built(tmp_path: Path) -> None:
    """``python -m benchmarks.matrix --first-epoch``: per kind, the default module's epochs 1-N from a
    fresh index folder (the background build started by its ``prepare_data``), after which epoch the build had
    ended, and epochs 1-3 without an index, with the ratios the docs quote; the JSON as returned."""
    from benchmarks import matrix

    out = tmp_path / "first.json"
    result = matrix.main(
        ["--first-epoch", "--kinds", "photo 256x192 q75", "--files", "16", "--workers", "0", "--batch-size", "4",
         "--image-size", "32", "--repeats", "2", "--epochs", "4", "--step-ms", "1", "--scratch", str(tmp_path / "s"),
         "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    (kind,) = result["kinds"]
    assert kind["kind"] == "photo 256x192 q75" and kind["files"] == 16 and kind["epochs"] == 4
    assert kind["step_ms"] == 1.0  # a 1 ms sleep after each of the 4 batches: no epoch of 16 faster than 4 ms
    assert max(max(runs) for runs in kind["runs"].values()) < 16 / 0.004
    assert set(kind["img_s"]) == {*(f"auto: epoch {e}" for e in range(1, 5)), "auto: last 3", "auto: while built",
                                  "off: epoch 1", "off: epochs 2-3"}  # fmt: skip
    assert all(len(runs) == 2 and min(runs) > 0 for runs in kind["runs"].values())
    assert kind["epoch1_vs_off"] == kind["img_s"]["auto: epoch 1"] / kind["img_s"]["off: epoch 1"]
    assert kind["last3_vs_off"] == kind["img_s"]["auto: last 3"] / kind["img_s"]["off: epochs 2-3"]
    last3 = [sum(kind["runs"][f"auto: epoch {e}"][r] for e in (2, 3, 4)) / 3 for r in range(2)]
    assert kind["runs"]["auto: last 3"] == pytest.approx(last3)
    assert len(kind["built_after_epoch"]) == 2 and all(e in (None, 1, 2, 3, 4) for e in kind["built_after_epoch"])
    # the files the build covered after each epoch (its finished pieces): never fewer, whole from built_after on
    for covered, built in zip(kind["indexed_after_epoch"], kind["built_after_epoch"], strict=True):
        assert len(covered) == 4 and covered == sorted(covered) and all(0 <= c <= 16 for c in covered)
        assert built is None or (covered[built - 1] == 16 and (built == 1 or covered[built - 2] < 16))
    while_built = [  # epochs 2 to the one after which the index was whole (2 at least; the last if never)
        16 * (n := max(2, b or 4) - 1) / sum(16 / kind["runs"][f"auto: epoch {e}"][r] for e in range(2, n + 2))
        for r, b in enumerate(kind["built_after_epoch"])
    ]
    assert kind["runs"]["auto: while built"] == pytest.approx(while_built)
    assert kind["while_built_vs_off"] == kind["img_s"]["auto: while built"] / kind["img_s"]["off: epochs 2-3"]
    # each repeat built (or began to build) its own index in its own fresh folder under the kind's scratch
    assert len(list((tmp_path / "s" / "photo_256x192_q75").glob("first-epoch-*"))) == 2


@pytest.mark.timeout(300)
def test_bench_predict_suite_times_the_baseline_and_our_predict_loader(tmp_path: Path) -> None:
    """The predict suite's three rows at each worker count, each a measured rate over the same images."""
    result = main(
        [
            "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "12", "--suites", "predict",
            "--workers", "0", "2", "--batch-size", "8", "--image-size", "48", "--repeats", "1", "--min-seconds", "0",
        ]
    )  # fmt: skip
    rows = result["suites"]["predict"]
    assert [r["num_workers"] for r in rows] == [0, 0, 0, 2, 2, 2]
    assert rows[0]["loader"].startswith("baseline") and "predict_dataloader" in rows[1]["loader"]
    assert all(r["images_per_s"] > 0 for r in rows) and rows[0]["vs_baseline"] == 1.0


@pytest.mark.timeout(300)
def test_the_shards_suite_times_the_peers_and_ours_on_the_same_shards(tmp_path: Path) -> None:
    """``fastdata bench --suites shards``: the same images as tar shards through webdataset + torchvision and as
    Parquet through the hubs' datasets library (the baselines), through ShardDataModule, and the folder module."""
    from lightning_fastdata.bench.loaders import main

    result = main(
        [
            "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "16", "--suites", "shards",
            "--workers", "2", "--batch-size", "8", "--repeats", "1", "--min-seconds", "0",
            "--scratch", str(tmp_path / "scratch"),
        ]
    )  # fmt: skip
    rows = {row["loader"]: row for row in result["suites"]["shards"]}
    assert list(rows) == [
        "webdataset + torchvision (shuffle buffer 1000)",
        "ShardDataModule (tar)",
        "ShardDataModule (tar, entropy_index=True)",
        "datasets + torchvision (with_transform)",
        "ShardDataModule (parquet)",
        "ShardDataModule (parquet, full shuffle)",
        "ImageFolderDataModule (same images)",
    ]
    assert all(row["images_per_s"] > 0 and row["num_workers"] == 2 for row in rows.values())
    assert rows["ShardDataModule (parquet)"]["baseline"] == "datasets + torchvision (with_transform)"
    parquet = rows["ShardDataModule (parquet)"]
    assert parquet["vs_baseline"] == parquet["images_per_s"] / rows[parquet["baseline"]]["images_per_s"]
    assert list((tmp_path / "scratch" / "shards").glob("shard-*.tar"))
    assert list((tmp_path / "scratch" / "parquet").glob("shard-*.parquet"))


@pytest.mark.timeout(180)
def test_the_segmentation_suite_times_the_reference_and_ours_on_the_same_scenes(tmp_path: Path) -> None:
    """``fastdata bench --suites segmentation``: torchvision's reference loader, ours, ours with the CPU normalise,
    ours from an HDF5 file of the same scenes, from its cache and with the entropy index; the decode ceiling beside
    them; no image folder generated."""
    from lightning_fastdata.bench.loaders import main

    result = main(
        ["--suites", "segmentation", "--seg-images", "12", "--seg-size", "96x72", "--seg-batch-size", "2",
         "--base-size", "64", "--crop-size", "48", "--workers", "2", "--repeats", "1", "--min-seconds", "0",
         "--scratch", str(tmp_path / "scratch"), "--root", str(tmp_path / "never"), "--json", str(tmp_path / "s.json")]
    )  # fmt: skip
    suite = result["suites"]["segmentation"]
    rows = {r["loader"]: r for r in suite["rows"]}
    assert list(rows) == [
        "torchvision reference (v2, PIL)", "SegmentationDataModule (loader only)",
        "SegmentationDataModule + CPU normalise", "SegmentationDataModule (HDF5, encoded)",
        "SegmentationDataModule (cache_dir: decoded once)", "SegmentationDataModule (entropy_index)",
    ]  # fmt: skip
    assert all(r["images_per_s"] > 0 and r["num_workers"] == 2 for r in rows.values())
    assert suite["decode_ceiling_1core"] > 0 and suite["data"]["images"] == 12
    assert list((tmp_path / "scratch" / "segmentation-index").glob("entropy-*/*"))  # built before the timing
    assert (tmp_path / "s.json").is_file() and not (tmp_path / "never").exists()


@pytest.mark.timeout(180)
def test_the_detection_suite_times_the_reference_and_ours_on_the_same_images_and_boxes(tmp_path: Path) -> None:
    """``fastdata bench --suites detection``: torchvision's detection reference loader (``CocoDetection`` wrapped for
    transforms v2, its ssd and hflip presets) and ours, from the images and from the decoded cache, each recipe
    against its own, on the bench photos copied into a COCO layout with random boxes inside each image."""
    import json

    from lightning_fastdata.bench.loaders import main

    result = main(
        ["--suites", "detection", "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "8",
         "--det-images", "12", "--det-batch-size", "2", "--workers", "0", "--repeats", "1", "--min-seconds", "0",
         "--scratch", str(tmp_path / "scratch")]
    )  # fmt: skip
    suite = result["suites"]["detection"]
    rows = {r["loader"]: r for r in suite["rows"]}
    assert list(rows) == [
        "torchvision reference (ssd)", "DetectionDataModule (ssd)", "DetectionDataModule (ssd, cache)",
        "torchvision reference (hflip)", "DetectionDataModule (hflip)", "DetectionDataModule (hflip, cache)",
    ]  # fmt: skip
    assert len(list((tmp_path / "scratch" / "detection-cache").glob("boxes-*/manifest.json"))) == 1  # one cache
    assert all(r["images_per_s"] > 0 for r in rows.values()) and suite["data"]["images"] == 12
    assert rows["DetectionDataModule (ssd)"]["vs_baseline"] == pytest.approx(
        rows["DetectionDataModule (ssd)"]["images_per_s"] / rows["torchvision reference (ssd)"]["images_per_s"]
    )
    doc = json.loads((tmp_path / "scratch" / "coco-12" / "annotations" / "instances_train2017.json").read_text())
    sizes = {im["id"]: (im["width"], im["height"]) for im in doc["images"]}
    for a in doc["annotations"]:
        x, y, w, h = a["bbox"]
        assert 0 <= x and x + w <= sizes[a["image_id"]][0] and 0 <= y and y + h <= sizes[a["image_id"]][1]


@pytest.mark.timeout(180)
def test_the_captions_suite_times_webdataset_and_ours_on_the_same_shards(tmp_path: Path) -> None:
    """``fastdata bench --suites captions``: webdataset + open_clip's pipeline and ``ImageTextDataModule`` on the bench
    photos written as img2dataset shards, the same stand-in tokenizer in both (open_clip's output shape)."""
    import tarfile

    import torch

    from lightning_fastdata.bench.loaders import main
    from lightning_fastdata.captions.text import HashTokenizer

    result = main(
        ["--suites", "captions", "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "8",
         "--cap-images", "12", "--cap-batch-size", "4", "--cap-image-size", "32", "--workers", "0", "--repeats", "1",
         "--min-seconds", "0", "--scratch", str(tmp_path / "scratch")]
    )  # fmt: skip
    suite = result["suites"]["captions"]
    rows = {r["loader"]: r for r in suite["rows"]}
    assert list(rows) == ["webdataset + open_clip's pipeline", "ImageTextDataModule"]
    assert all(r["images_per_s"] > 0 for r in rows.values()) and suite["data"]["pairs"] == 12
    with tarfile.open(next((tmp_path / "scratch" / "pairs-12").glob("*.tar"))) as tf:
        assert {m.name.rsplit(".", 1)[1] for m in tf} == {"jpg", "txt", "json"}  # img2dataset's members
    ids = HashTokenizer()("a photo of a cat")
    assert ids.shape == (77,) and ids.dtype == torch.int64 and (ids[:5] > 0).all() and (ids[5:] == 0).all()
