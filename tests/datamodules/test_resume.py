"""Exact mid-epoch resume: one conformance helper for every DataModule (torchdata's run_test_save_load_state style).

Run N steps uninterrupted, recording each step's labels and per-image checksums (which identify the sample
and its augmentation); run again, stop at step k with a checkpoint, resume in a fresh process, and require the
concatenated records to equal the uninterrupted ones exactly.
"""

from __future__ import annotations

import csv
import json
import os
import runpy
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.captions import write_shards as write_caption_shards
from helpers.fork_client import SERVER, rank_procs

from benchmarks.s3_server import LocalS3, delete_objects, upload_folder
from lightning_fastdata import convert_folder_to_hdf5
from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.segmentation.convert import write_segmentation_parquet, write_segmentation_shards
from lightning_fastdata.segmentation.demos import make_segmentation_folder, make_segmentation_hdf5

HELPER = Path(__file__).parents[1] / "helpers" / "resume_run.py"
STEPS = 12  # 39 images, batch 8: 5 steps per epoch, so 12 steps cross two epoch boundaries


class Runs:
    """Starts each run as fresh processes forked from a server that has the imports done.

    See ``helpers/zygote.py``: every run is still its own new process (the resumed one shares nothing with the
    interrupted one); only the ~5 s import of torch and Lightning is paid once. A DDP run's ranks are forked at
    once, each told its rank by the environment as ``torchrun`` tells a script's (``test_ddp.py`` keeps Lightning's
    own launcher, which starts the other ranks as scripts).
    """

    def __init__(self) -> None:
        self.started = 0

    def __call__(self, cfg: dict[str, Any]) -> tuple[int, str]:
        """Run one config; return its exit code (rank 0's, or a failed rank's) and output (every rank's)."""
        self.started += 1
        request = {"cfg": cfg, "log": f"{cfg['record']}.run{self.started}.log"}
        if cfg.get("devices", 1) > 1:
            request["procs"] = rank_procs(cfg["devices"])
        return SERVER.request(request)


RUNS = Runs()


def run(cfg: dict[str, Any], expect_kill: bool = False, expect_error: str | None = None) -> None:
    code, output = RUNS(cfg)
    if expect_kill:
        assert code == -signal.SIGKILL, output[-3000:]
    elif expect_error:
        assert code != 0 and expect_error in output, output[-3000:]
    else:
        assert code == 0, output[-3000:]


def records(path: Path, rank: int = 0) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in Path(f"{path}.rank{rank}").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "rank"} for line in lines]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = make_image_folder(tmp_path_factory.mktemp("resume") / "src", num_classes=3, per_class=13, size=(40, 30))
    h5 = convert_folder_to_hdf5(root, root.parent / "src.h5", mode="encoded", processes=1, progress=False)
    # the same images in one flat folder, labelled by a table: two labels each (its class, and odd or even)
    flat = root.parent / "flat"
    flat.mkdir()
    rows = [["id", "tags"]]
    for k, image in enumerate(sorted(root.rglob("*.jpg"))):
        shutil.copy(image, flat / f"{k:03d}.jpg")
        rows.append([f"{k:03d}", f"{image.parent.name} {'odd' if k % 2 else 'even'}"])
    with open(root.parent / "tags.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    shards = write_tar_shards(root, root.parent / "shards", shard_bytes=8_000)
    parquet = write_parquet_shards(root, root.parent / "parquet", shard_bytes=8_000, rows_per_group=4)
    scenes = make_segmentation_folder(root.parent / "scenes", count=49, size=(40, 30), seed=2)  # 39 to train on
    scenes_h5 = make_segmentation_hdf5(root.parent / "scenes.h5", count=39, size=(40, 30), seed=2, encoded=True,
                                       groups=False)  # fmt: skip
    write_segmentation_shards(scenes, "train", root.parent / "scene-shards" / "train", shard_bytes=30_000)
    write_segmentation_parquet(scenes, "train", root.parent / "scene-parquet" / "train", shard_bytes=30_000,
                               rows_per_group=4)  # fmt: skip
    write_caption_shards(root.parent / "captions", 41, 8)  # 39 pairs: 2 keys broken, as img2dataset leaves them
    return {
        "captions": str(root.parent / "captions"),
        "segmentation_parquet": str(root.parent / "scene-parquet"),
        "segmentation": str(scenes), "segmentation_h5": str(scenes_h5),
        "segmentation_shards": str(root.parent / "scene-shards"),
        "folder": str(root), "hdf5": str(h5), "cache": str(root), "flat": str(flat), "table": f.name,
        "shards": str(shards[0].parent), "parquet": str(parquet[0].parent),
    }  # fmt: skip


_UNINTERRUPTED: dict[tuple, Path] = {}


def uninterrupted(base: dict[str, Any], tmp_path: Path) -> Path:
    """The reference run, once per (kind, workers, devices) for the whole module."""
    key = (base["kind"], base["workers"], base["devices"], base.get("snapshot"), base["source"])
    key += (base.get("batch_size"), base.get("block_shuffle"), base.get("recipe"), base.get("labels"))
    key += (json.dumps(base.get("sampling"), sort_keys=True), base.get("mix_with"), base.get("shuffle_buffer"))
    key += (base.get("seg_policy"),)
    if key not in _UNINTERRUPTED:
        record = tmp_path / "full"
        run({**base, "max_steps": STEPS, "record": str(record)})
        _UNINTERRUPTED[key] = record
    return _UNINTERRUPTED[key]


def stopped_at(cfg: dict[str, Any], k: int, tmp: Path, record: str = "old") -> str:
    """Run ``cfg`` for ``k`` steps, recording into ``tmp/record``, with a checkpoint at step ``k``; return its path."""
    run({**cfg, "max_steps": k, "record": str(tmp / record), "save_every": k, "ckpt_dir": str(tmp / "ck")})
    return str(tmp / "ck" / "last.ckpt")


def conformance(tmp_path: Path, kind: str, source: str, workers: int, k: int, devices: int = 1, **extra: Any) -> None:
    """The helper every stateful loader goes through."""
    base = {"kind": kind, "source": source, "workers": workers, "devices": devices, "cache_dir": str(tmp_path / "c")}
    if "storage_options" in extra:
        base["storage_options"] = extra.pop("storage_options")
    if "snapshot" in extra:
        base["snapshot"] = extra.pop("snapshot")
    if "labels" in extra:
        base.update(labels=extra.pop("labels"), multi_label=extra.pop("multi_label"))
    if "sampling" in extra:
        base["sampling"] = extra.pop("sampling")
    if "mix_with" in extra:
        base["mix_with"] = extra.pop("mix_with")
    if "shuffle_buffer" in extra:
        base["shuffle_buffer"] = extra.pop("shuffle_buffer")
    if "seg_policy" in extra:
        base["seg_policy"] = extra.pop("seg_policy")
    full_record = uninterrupted(base, tmp_path)
    ckpt = stopped_at(base, k, tmp_path, record="part")
    run({**base, "max_steps": STEPS, "record": str(tmp_path / "part"), "ckpt_path": ckpt, **extra})
    for rank in range(devices):
        full, part = records(full_record, rank), records(tmp_path / "part", rank)
        assert [r["step"] for r in part] == list(range(STEPS))
        assert part == full, f"rank {rank}: resumed run differs from the uninterrupted one"


@pytest.mark.slow  # over 7 s on the 2-core VM (the project's rule: over ~4 s is the slow tier)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_from_tar_shards(tmp_path: Path, sources: dict[str, str], workers: int) -> None:
    """Tar shards (several, a sample read by its offset) resume mid-epoch at the exact sample under a Trainer."""
    assert len(list(Path(sources["shards"]).glob("*.tar"))) > 2
    conformance(tmp_path, "shards", sources["shards"], workers, 2)


@pytest.mark.timeout(300)
def test_resume_is_exact_from_parquet_shards_in_windows_of_row_groups(tmp_path: Path, sources: dict) -> None:
    """Parquet files (row groups of 4 rows, shuffled in windows of 2) resume mid-epoch at the exact sample."""
    assert len(list(Path(sources["parquet"]).glob("*.parquet"))) > 2
    conformance(tmp_path, "shards", sources["parquet"], 2, 3, shuffle_buffer=8)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fmt", ["shards", "parquet"])
def test_resume_is_exact_from_shards_in_a_bucket(tmp_path: Path, sources: dict, s3: LocalS3, fmt: str) -> None:
    """Shards read in place (tar members in runs, Parquet row groups; windows of either) resume mid-epoch at the
    exact sample through 2 workers."""
    url = s3.url(f"resume-{fmt}-{tmp_path.name}")
    upload_folder(sources[fmt], url, s3.storage_options())
    conformance(tmp_path, "shards", url, 2, 3, storage_options=s3.storage_options(), shuffle_buffer=8)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", ["local", "bucket", "hdf5", "shards", "parquet"])
def test_resume_is_exact_from_segmentation_scenes(tmp_path: Path, sources: dict, s3: LocalS3, where: str) -> None:
    """Images and masks (VOC's layout, locally and in a bucket; an HDF5 file; tar shards; Parquet files, in windows
    of row groups) resume mid-epoch at the exact sample through 2 workers: the same image and mask checksums (their
    windows from each sample's key) step for step."""
    named = {"hdf5": "segmentation_h5", "shards": "segmentation_shards", "parquet": "segmentation_parquet"}
    source, extra = sources[named.get(where, "segmentation")], {}
    if where == "bucket":
        source = s3.url(f"resume-scenes-{tmp_path.name}")
        upload_folder(sources["segmentation"], source, s3.storage_options())
        extra = {"storage_options": s3.storage_options()}
    conformance(tmp_path, "segmentation", source, 2, 7, **extra)


@pytest.mark.timeout(600)
def test_resume_is_exact_with_segmentation_classes_and_weights(tmp_path: Path, sources: dict) -> None:
    """``classes=`` (masks renumbered), weights by class and an epoch size: resumed mid-epoch, the same images,
    windows and masks step for step through 2 workers."""
    sampling = {"classes": ["green", "red"], "sample_weights": {"red": 4.0}, "epoch_size": 30}
    conformance(tmp_path, "segmentation", sources["segmentation"], 2, 5, sampling=sampling)


@pytest.mark.timeout(600)
def test_resume_is_exact_with_a_segmentation_device_policy(tmp_path: Path, sources: dict) -> None:
    """TrivialAugmentWide on the device (warps on images and masks, colours on images): resumed mid-epoch, the same
    augmented images and masks step for step (each sample's op drawn from its key)."""
    conformance(tmp_path, "segmentation", sources["segmentation"], 2, 7, seg_policy=True)


@pytest.mark.timeout(600)
def test_resume_is_exact_from_a_segmentation_cache(tmp_path: Path, sources: dict) -> None:
    """Scenes decoded once into a cache (prepare_data) resume mid-epoch at the exact crop and mask, 2 workers."""
    conformance(tmp_path, "segmentation_cache", sources["segmentation"], 2, 7)
    assert len(list((tmp_path / "c").glob("mask-*"))) == 1  # built once, by the first run


@pytest.mark.timeout(600)
def test_resume_is_exact_with_a_mix_of_segmentation_sources(tmp_path: Path, sources: dict) -> None:
    """A VOC folder and an HDF5 file of scenes drawn 1:2 resume mid-epoch at the exact image, window and mask."""
    conformance(tmp_path, "segmentation_mixed", sources["segmentation"], 2, 5, mix_with=sources["segmentation_h5"])


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_segmentation_continues_from_two_ranks_on_one(tmp_path: Path, sources: dict[str, str]) -> None:
    """2 ranks x 2 workers stopped after step 2, continued on 1 rank without workers: every image and mask of the
    interrupted epoch trained once (the same windows), the next epoch as one rank's."""
    base = {"kind": "segmentation", "source": sources["segmentation"], "workers": 0, "devices": 1, "cache_dir": ""}
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at({**base, "devices": 2, "workers": 2}, 2, tmp_path)
    run({**base, "max_steps": 8, "record": str(tmp_path / "one"), "ckpt_path": ckpt})
    old, one = every_rank(tmp_path / "old", 2), records(tmp_path / "one")
    assert sorted(samples(old[0], 0) + samples(old[1], 0) + samples(one, 0)) == sorted(samples(single, 0))
    assert samples(one, 1) == samples(single, 1)[: len(samples(one, 1))] and len(samples(one, 1)) > 8


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_parquet_shards_continue_from_two_ranks_on_one(tmp_path: Path, sources: dict[str, str]) -> None:
    """2 ranks x 2 workers stopped after step 1 (each rank its own windows of row groups), continued on 1 rank
    without workers: the epoch's samples left, none lost or trained twice; the next epoch as one rank's."""
    base = {"kind": "shards", "source": sources["parquet"], "workers": 0, "devices": 1, "shuffle_buffer": 8}
    base["cache_dir"] = str(tmp_path / "c")
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at({**base, "devices": 2, "workers": 2}, 1, tmp_path)
    run({**base, "max_steps": 6, "record": str(tmp_path / "one"), "ckpt_path": ckpt})
    old, one = every_rank(tmp_path / "old", 2), records(tmp_path / "one")
    assert len(samples(old[0], 0)) == len(samples(old[1], 0)) == 8
    assert sorted(samples(old[0], 0) + samples(old[1], 0) + samples(one, 0)) == sorted(samples(single, 0))
    assert samples(one, 1) == samples(single, 1)[: len(samples(one, 1))] and len(samples(one, 1)) == 16


@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", [2, 5, 8], ids=["in-first-epoch", "epoch-boundary", "later-epoch"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["folder", "hdf5", "cache"])
def test_resume_is_exact(tmp_path: Path, sources: dict[str, str], kind: str, workers: int, k: int) -> None:
    conformance(tmp_path, kind, sources[kind], workers, k)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["folder", "cache"])
def test_resume_is_exact_with_labels_from_a_table(tmp_path: Path, sources: dict[str, str], kind: str) -> None:
    """A flat folder labelled by a multi-label table: the resumed run's steps (multi-hot rows, pixels) equal the
    uninterrupted run's, mid-epoch, through workers, from the folder and from a tensor cache built from it."""
    conformance(tmp_path, kind, sources["flat"], 2, 8, labels=sources["table"], multi_label=True)
    steps = records(tmp_path / "part")
    assert all(len(row) == 5 and sum(row) == 2 for step in steps for row in step["labels"])  # 3 classes + odd/even


#: Weighted draws over a subset, 30 samples an epoch (batches of 8: 8, 8, 8, 6), another class list.
SAMPLING = {"sample_weights": {"class_002": 4.0}, "epoch_size": 30, "classes": ["class_002", "class_000"]}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", [2, 6], ids=["in-first-epoch", "in-second-epoch"])
@pytest.mark.parametrize("kind", ["folder", "hdf5", "cache"])
def test_resume_is_exact_with_weights_an_epoch_size_and_a_subset(
    tmp_path: Path, sources: dict[str, str], kind: str, k: int
) -> None:
    """Every DataModule with sample weights, epoch_size and classes=: the resumed steps equal the uninterrupted run's
    (labels in the subset's numbering, pixels), mid-epoch, through workers."""
    conformance(tmp_path, kind, sources[kind], 2, k, sampling=SAMPLING)
    steps = records(tmp_path / "part")
    assert [len(s["labels"]) for s in steps if s["epoch"] == 0] == [8, 8, 8, 6]
    labels = Counter(label for s in steps for label in s["labels"])
    assert set(labels) == {0, 1} and labels[0] > labels[1]  # class_002 (now 0) weighs 4: drawn ~4x as often


@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", [2, 6], ids=["in-first-epoch", "in-second-epoch"])
def test_resume_is_exact_with_a_mix_of_a_folder_and_an_hdf5_file(
    tmp_path: Path, sources: dict[str, str], k: int
) -> None:
    """MixedDataModule (the folder and the HDF5 file, weights 1:2, 30 draws an epoch): the resumed steps equal the
    uninterrupted run's, mid-epoch, through workers."""
    conformance(tmp_path, "mixed", sources["folder"], 2, k, mix_with=sources["hdf5"])
    assert [len(s["labels"]) for s in records(tmp_path / "part") if s["epoch"] == 0] == [8, 8, 8, 6]


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_mix_continues_on_another_world_size(tmp_path: Path, sources: dict[str, str]) -> None:
    """Stopped after 2 steps on one rank, continued on two: the mix's draws left split over the ranks, none lost."""
    base = {"kind": "mixed", "source": sources["folder"], "mix_with": sources["hdf5"], "workers": 0, "devices": 1}
    base["cache_dir"] = str(tmp_path / "c")
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at(base, 2, tmp_path)
    run({**base, "devices": 2, "max_steps": 4, "record": str(tmp_path / "two"), "ckpt_path": ckpt})
    old, ranks = records(tmp_path / "old"), every_rank(tmp_path / "two", 2)
    assert [len(samples(r, 0)) for r in ranks] == [7, 7]
    assert sorted(samples(old, 0) + samples(ranks[0], 0) + samples(ranks[1], 0)) == sorted(samples(single, 0))


@pytest.mark.timeout(900)
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["weights", "mix"])
def test_weighted_draws_and_a_mix_continue_from_two_ranks_on_one(
    tmp_path: Path, sources: dict[str, str], kind: str
) -> None:
    """2 ranks x 2 workers stopped after step 1 (16 of the epoch's 30 draws), continued on 1 rank without workers:
    the 14 draws left in one rank's batches (8, 6), none lost or trained twice."""
    if kind == "weights":
        base: dict[str, Any] = {"kind": "folder", "source": sources["folder"], "sampling": SAMPLING}
    else:
        base = {"kind": "mixed", "source": sources["folder"], "mix_with": sources["hdf5"]}
    base.update(workers=0, devices=1, cache_dir=str(tmp_path / "c"))
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at({**base, "devices": 2, "workers": 2}, 1, tmp_path)
    run({**base, "max_steps": 4, "record": str(tmp_path / "one"), "ckpt_path": ckpt})
    old, one = every_rank(tmp_path / "old", 2), records(tmp_path / "one")
    assert [len(r["labels"]) for r in one if r["epoch"] == 0] == [8, 6]
    assert sorted(samples(old[0], 0) + samples(old[1], 0) + samples(one, 0)) == sorted(samples(single, 0))


@pytest.mark.timeout(600)
def test_resuming_with_other_sampling_settings_is_refused_naming_them(tmp_path: Path, sources: dict[str, str]) -> None:
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "sampling": SAMPLING}
    base["cache_dir"] = str(tmp_path / "c")
    ckpt = stopped_at(base, 2, tmp_path)
    other = {**base, "sampling": {**SAMPLING, "sample_weights": {"class_002": 2.0}}}
    run({**other, "max_steps": 4, "record": str(tmp_path / "new"), "ckpt_path": ckpt}, expect_error="sample_weights")
    fewer = {**base, "sampling": {**SAMPLING, "epoch_size": 20}}
    run({**fewer, "max_steps": 4, "record": str(tmp_path / "new"), "ckpt_path": ckpt}, expect_error="epoch_size")


RESAMPLED = {"replacement": True, "epoch_size": 50}  # open_clip's --dataset-resampled --train-num-samples 50


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_resume_is_exact_from_caption_shards_drawn_with_replacement(tmp_path: Path, sources: dict[str, str]) -> None:
    """Image-caption pairs, 50 uniform draws with replacement an epoch from 39 pairs, 2 workers: stopped at step 3,
    resumed in a fresh process, the same captions and pixels step for step; pairs repeat within an epoch."""
    conformance(tmp_path, "captions", sources["captions"], 2, 3, sampling=RESAMPLED)
    first = samples(records(tmp_path / "part"), 0)
    assert len(first) == 50 and len({text for text, _ in first}) < 39  # with replacement: some drawn twice


@pytest.mark.timeout(900)
@pytest.mark.slow
@pytest.mark.parametrize("order", ["each-once", "resampled"])
def test_caption_orders_continue_from_two_ranks_on_one(tmp_path: Path, sources: dict[str, str], order: str) -> None:
    """Both orders of pairs on 2 ranks x 2 workers, the same number of batches on each; stopped after step 1,
    continued on 1 rank without workers: the draws left, none lost or trained twice, each caption as drawn."""
    base: dict[str, Any] = {"kind": "captions", "source": sources["captions"], "workers": 0, "devices": 1}
    base.update(cache_dir=str(tmp_path / "c"), sampling=RESAMPLED if order == "resampled" else None)
    single = records(uninterrupted(base, tmp_path))
    size = 50 if order == "resampled" else 39
    assert len(samples(single, 0)) == size
    run({**base, "devices": 2, "workers": 2, "max_steps": 4, "record": str(tmp_path / "two")})
    two = every_rank(tmp_path / "two", 2)
    per_rank = [[len(r["labels"]) for r in lines if r["epoch"] == 0] for lines in two]
    assert per_rank[0] == per_rank[1] == ([8, 8, 8, 1] if order == "resampled" else [8, 8, 4])  # 50 / 2; 39 padded
    ckpt = stopped_at({**base, "devices": 2, "workers": 2}, 1, tmp_path)
    run({**base, "max_steps": 6, "record": str(tmp_path / "one"), "ckpt_path": ckpt})
    old, one = every_rank(tmp_path / "old", 2), records(tmp_path / "one")
    assert len(samples(one, 0)) == size - 16
    assert sorted(samples(old[0], 0) + samples(old[1], 0) + samples(one, 0)) == sorted(samples(single, 0))


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_weighted_draws_continue_on_another_world_size(tmp_path: Path, sources: dict[str, str]) -> None:
    """Stopped after 2 steps on one rank, continued on two: the epoch's draws left are split over the two ranks
    (7 each), nothing trained twice or lost; the next epoch is whole on both."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "sampling": SAMPLING}
    base["cache_dir"] = str(tmp_path / "c")
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at(base, 2, tmp_path)
    run({**base, "devices": 2, "max_steps": 4, "record": str(tmp_path / "two"), "ckpt_path": ckpt})
    old, ranks = records(tmp_path / "old"), every_rank(tmp_path / "two", 2)
    assert len(samples(old, 0)) == 16 and [len(samples(r, 0)) for r in ranks] == [7, 7]
    assert sorted(samples(old, 0) + samples(ranks[0], 0) + samples(ranks[1], 0)) == sorted(samples(single, 0))
    assert len(samples(ranks[0], 1)) == len(samples(ranks[1], 1)) > 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_from_a_bucket(tmp_path: Path, sources: dict[str, str], s3: LocalS3, workers: int) -> None:
    """The same conformance on the folder uploaded to a local S3 server: order never depends on request timing."""
    url = s3.url("resume-src")
    if not _UPLOADED:
        upload_folder(sources["folder"], url, s3.storage_options())
        _UPLOADED.append(url)
    conformance(tmp_path, "folder", url, workers, 3, storage_options=s3.storage_options())
    local = {"kind": "folder", "source": sources["folder"], "workers": workers, "devices": 1, "cache_dir": ""}
    bucket = {**local, "source": url}
    (tmp_path / "local").mkdir()
    assert records(uninterrupted(bucket, tmp_path)) == records(uninterrupted(local, tmp_path / "local"))


_UPLOADED: list[str] = []


@pytest.mark.timeout(600)
def test_an_elastic_resume_from_a_bucket(tmp_path: Path, sources: dict[str, str], s3: LocalS3) -> None:
    """An ``s3://`` root continues by samples too: 2 workers, batch 8 -> 0 workers, batch 4, same order as local."""
    url = s3.url("resume-src")
    if not _UPLOADED:
        upload_folder(sources["folder"], url, s3.storage_options())
        _UPLOADED.append(url)
    local = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "cache_dir": ""}
    single = records(uninterrupted(local, tmp_path))
    bucket = {**local, "source": url, "storage_options": s3.storage_options()}
    ckpt = stopped_at({**bucket, "workers": 2}, 2, tmp_path)
    run({**bucket, "batch_size": 4, "max_steps": 8, "record": str(tmp_path / "new"), "ckpt_path": ckpt})
    old, new = records(tmp_path / "old"), records(tmp_path / "new")
    assert samples(old, 0) + samples(new, 0) == samples(single, 0)


@pytest.mark.timeout(600)
def test_resume_when_configure_optimizers_reads_estimated_stepping_batches(tmp_path: Path, sources: dict) -> None:
    """Lightning #20550: touching estimated_stepping_batches loads the data before the checkpoint is restored."""
    conformance(tmp_path, "folder", sources["folder"], 2, 8, stepping=True, max_epochs=3)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("snapshot", [3, 4])
def test_resume_is_exact_with_sparse_snapshots(tmp_path: Path, sources: dict[str, str], snapshot: int) -> None:
    """Checkpoints between snapshots: the loader replays the batches since the last snapshot."""
    conformance(tmp_path, "folder", sources["folder"], 2, 7, snapshot=snapshot)


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_resume_is_exact_under_two_process_ddp(tmp_path: Path, sources: dict[str, str]) -> None:
    """Each rank continues with its own shard: the checkpoint holds every rank's loader state.

    Two launches, not three: the uninterrupted run saves at step 7 on its way (the periodic checkpoint a run that
    crashes later leaves behind; the same save in ``on_train_batch_end`` as a run stopped there), and a fresh
    launch resumes from it. The per-rank state is the DataModule base's, the same for every kind: folder here.
    """
    base = {"kind": "folder", "source": sources["folder"], "workers": 2, "devices": 2}
    base["cache_dir"] = str(tmp_path / "c")
    ckpts = tmp_path / "ck"
    run({**base, "max_steps": STEPS, "record": str(tmp_path / "full"), "save_every": 7, "ckpt_dir": str(ckpts)})
    (ckpt,) = ckpts.glob("*step=7.ckpt")
    run({**base, "max_steps": STEPS, "record": str(tmp_path / "resumed"), "ckpt_path": str(ckpt)})
    for rank in range(2):
        full, resumed = records(tmp_path / "full", rank), records(tmp_path / "resumed", rank)
        assert [r["step"] for r in full] == list(range(STEPS))
        assert resumed == full[7:], f"rank {rank}: resumed run differs from the uninterrupted one"
    assert records(tmp_path / "full", 0) != records(tmp_path / "full", 1)  # two shards, not one stream twice


@pytest.mark.timeout(600)
@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "FastDataCallback"])
def test_sigkill_then_resume_from_the_last_checkpoint_on_disk(
    tmp_path: Path, sources: dict[str, str], prefetch: bool
) -> None:
    """With the callback, the killed and the resumed runs prefetch; the reference run does not (same batches)."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 2, "devices": 1, "cache_dir": str(tmp_path / "c")}
    full = records(uninterrupted(base, tmp_path))
    base["prefetch"] = prefetch  # the GPU twin of this test is in test_cuda.py
    killed, resumed = killed_then_resumed(base, tmp_path, kill_at=8)
    assert [r["step"] for r in killed] == list(range(8))
    assert resumed[0]["step"] == 6  # from the checkpoint on disk, not from where the process died
    assert killed[:6] + resumed == full


def killed_then_resumed(
    base: dict[str, Any], tmp_path: Path, kill_at: int, **resume: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``base`` run with a checkpoint every 3 steps and SIGKILLed at the start of step ``kill_at``, then resumed
    (with ``resume`` changed) from the last checkpoint on disk; both runs' records."""
    ckpts = str(tmp_path / "ck")
    killed_cfg = {**base, "max_steps": STEPS, "record": str(tmp_path / "killed"), "save_every": 3, "ckpt_dir": ckpts}
    run({**killed_cfg, "kill_at": kill_at}, expect_kill=True)
    resumed_cfg = {**base, "max_steps": STEPS, "record": str(tmp_path / "resumed"), **resume}
    run({**resumed_cfg, "ckpt_path": f"{ckpts}/last.ckpt"})
    return records(tmp_path / "killed"), records(tmp_path / "resumed")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["folder", "cache"])
def test_a_recipe_killed_and_resumed_with_other_workers_trains_the_same_pixels_and_targets(
    tmp_path: Path, sources: dict[str, str], kind: str
) -> None:
    """Worker and device augmentation, RandomErasing, MixUp/CutMix and repeated augmentation: bit for bit."""
    base = {"kind": kind, "source": sources[kind], "workers": 2, "devices": 1, "cache_dir": str(tmp_path / "c")}
    base["recipe"] = True
    full = records(uninterrupted(base, tmp_path))
    assert any(isinstance(r["labels"][0], list) for r in full)  # soft targets
    killed, resumed = killed_then_resumed(base, tmp_path, kill_at=7, workers=0)
    assert resumed[0]["step"] == 6
    assert killed[:6] + resumed == full


def samples(lines: list[dict[str, Any]], epoch: int) -> list[tuple[int, float]]:
    """(label, checksum) of every sample trained in ``epoch``, in step order: the checksum identifies the image and
    its augmentation, which derive from (seed, epoch, index) whichever rank or worker decodes it."""
    return [(label, x) for r in lines if r["epoch"] == epoch for label, x in zip(r["labels"], r["sums"])]


def every_rank(record: Path, ranks: int) -> list[list[dict[str, Any]]]:
    return [records(record, r) for r in range(ranks)]


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, str]) -> dict[str, Any]:
    """A 2-rank DDP fit (2 workers) stopped at step 2 of epoch 0 (3 steps of 8, 8, 4 per rank): 32 of 39 trained."""
    tmp = tmp_path_factory.mktemp("two-ranks")
    cfg = {"kind": "folder", "source": sources["folder"], "workers": 2, "devices": 2, "cache_dir": str(tmp / "c")}
    return {"ckpt": stopped_at(cfg, 2, tmp), "old": every_rank(tmp / "old", 2)}


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_two_ranks_with_workers_continue_on_one_rank_without_workers(
    tmp_path: Path, sources: dict[str, str], two_rank_checkpoint: dict[str, Any]
) -> None:
    """2 ranks x 2 workers -> 1 rank, 0 workers: epoch 0's 7 samples left in one step, then epoch 1 as on 1 rank."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "cache_dir": str(tmp_path / "c")}
    single = records(uninterrupted(base, tmp_path))  # one rank: 5 steps per epoch
    code, output = RUNS(
        {**base, "max_steps": 8, "record": str(tmp_path / "one"), "ckpt_path": two_rank_checkpoint["ckpt"]}
    )
    assert code == 0, output[-3000:]
    assert "continuing epoch 0 on 1 rank(s) (the checkpoint is from 2 rank(s)" in output
    resumed = records(tmp_path / "one")
    old = two_rank_checkpoint["old"]
    assert [len(r["labels"]) for r in resumed if r["epoch"] == 0] == [7]
    # every sample of the interrupted epoch trained exactly once across the interruption
    assert sorted(samples(old[0] + old[1] + resumed, 0)) == sorted(samples(single, 0))
    # the next epoch is what a run started on one rank sees, step for step
    assert samples(resumed, 1) == samples(single, 1)
    assert [r["step"] for r in resumed] == list(range(2, 8))


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_two_ranks_continue_on_three(
    tmp_path: Path, sources: dict[str, str], two_rank_checkpoint: dict[str, Any]
) -> None:
    """2 -> 3 ranks: the 7 samples left are padded to 9 (3 per rank, as DistributedSampler pads), then epoch 1 whole."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "cache_dir": str(tmp_path / "c")}
    single = records(uninterrupted(base, tmp_path))
    cfg = {**base, "devices": 3, "max_steps": 5, "record": str(tmp_path / "three")}
    run({**cfg, "ckpt_path": two_rank_checkpoint["ckpt"]})
    ranks = every_rank(tmp_path / "three", 3)
    old = two_rank_checkpoint["old"]
    left = [samples(r, 0) for r in ranks]
    assert [len(x) for x in left] == [3, 3, 3]  # equal steps on every rank
    trained = samples(old[0] + old[1], 0) + sum(left, [])
    assert set(trained) == set(samples(single, 0)) and len(trained) == 39 + 2  # 2 pads, nothing else twice
    order = samples(single, 1)  # epoch 1's permutation, as one rank trains it
    for r, lines in enumerate(ranks):  # 39 = 3 x 13: rank r gets every third sample of it
        assert samples(lines, 1) == order[r::3]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_one_rank_continues_on_two(tmp_path: Path, sources: dict[str, str]) -> None:
    """1 -> 2 ranks with workers: 16 of 39 trained; 23 left, padded to 24: 12 per rank in 2 steps (8, 4)."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 2, "devices": 1, "cache_dir": str(tmp_path / "c")}
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at(base, 2, tmp_path)
    run({**base, "devices": 2, "max_steps": 7, "record": str(tmp_path / "two"), "ckpt_path": ckpt})
    old, ranks = records(tmp_path / "old"), every_rank(tmp_path / "two", 2)
    assert [[len(r["labels"]) for r in lines if r["epoch"] == 0] for lines in ranks] == [[8, 4], [8, 4]]
    first = samples(single, 0)
    trained = samples(old, 0) + samples(ranks[0], 0) + samples(ranks[1], 0)
    assert sorted(trained) == sorted(first + first[:1])  # the pad is the epoch's first sample
    order = samples(single, 1)
    padded = order + order[:1]  # 39 on 2 ranks: 20 each, as a run started on 2 ranks
    for r, lines in enumerate(ranks):
        assert samples(lines, 1) == padded[r::2]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["folder", "hdf5", "cache"])
def test_another_batch_size_and_worker_count_continue_by_samples(
    tmp_path: Path, sources: dict[str, str], kind: str
) -> None:
    """Every DataModule: batch 8 with 2 workers stopped at step 2 (16 samples), resumed with batch 4 and 0 workers."""
    base = {"kind": kind, "source": sources[kind], "workers": 0, "devices": 1, "cache_dir": str(tmp_path / "c")}
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at({**base, "workers": 2}, 2, tmp_path)
    run({**base, "batch_size": 4, "max_steps": 18, "record": str(tmp_path / "new"), "ckpt_path": ckpt})
    old, new = records(tmp_path / "old"), records(tmp_path / "new")
    assert [len(r["labels"]) for r in new if r["epoch"] == 0] == [4, 4, 4, 4, 4, 3]
    assert samples(old, 0) + samples(new, 0) == samples(single, 0)  # one rank: the same order, by samples
    assert samples(new, 1) == samples(single, 1) and [len(r["labels"]) for r in new if r["epoch"] == 1][-1] == 3


@pytest.mark.timeout(600)
def test_an_elastic_resume_between_sparse_snapshots_counts_the_batches_after_the_snapshot(
    tmp_path: Path, sources: dict[str, str]
) -> None:
    """snapshot_every_n_steps=4, stopped at step 3: the state's sampler position is the snapshot's (step 0); the 3
    batches returned after it were trained too and must not be trained again on the new configuration."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "cache_dir": str(tmp_path / "c")}
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at({**base, "workers": 2, "snapshot": 4}, 3, tmp_path)
    run({**base, "batch_size": 4, "max_steps": 8, "record": str(tmp_path / "new"), "ckpt_path": ckpt})
    old, new = records(tmp_path / "old"), records(tmp_path / "new")
    assert len(samples(old, 0)) == 24
    assert samples(old, 0) + samples(new, 0) == samples(single, 0)


@pytest.mark.timeout(600)
def test_an_elastic_resume_when_configure_optimizers_loads_the_data_early(tmp_path: Path, sources: dict) -> None:
    """Lightning #20550: the loader is built before the fit loop's counters are restored; the shift still holds."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "cache_dir": str(tmp_path / "c")}
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at(base, 2, tmp_path)
    cfg = {**base, "batch_size": 16, "max_steps": 6, "max_epochs": 5, "stepping": True, "record": str(tmp_path / "new")}
    code, output = RUNS({**cfg, "ckpt_path": ckpt})
    assert code == 0 and "STEPPING True" in output, output[-3000:]  # the data was loaded early
    new = records(tmp_path / "new")
    assert [len(r["labels"]) for r in new if r["epoch"] == 0] == [16, 7]  # 23 left: the epoch ends after them
    assert samples(records(tmp_path / "old"), 0) + samples(new, 0) == samples(single, 0)
    assert samples(new, 1)[:16] == samples(single, 1)[:16]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_block_shuffle_continues_by_samples_on_another_world_size(tmp_path: Path, sources: dict[str, str]) -> None:
    """block_shuffle=4, 1 rank -> 2 ranks: the samples left split in contiguous runs; nothing trained twice."""
    base = {"kind": "folder", "source": sources["folder"], "workers": 0, "devices": 1, "block_shuffle": 4}
    base["cache_dir"] = str(tmp_path / "c")
    single = records(uninterrupted(base, tmp_path))
    ckpt = stopped_at(base, 3, tmp_path)
    run({**base, "devices": 2, "max_steps": 5, "record": str(tmp_path / "two"), "ckpt_path": ckpt})
    old, ranks = records(tmp_path / "old"), every_rank(tmp_path / "two", 2)
    first = samples(single, 0)
    rest = first[24:]  # 15 left in the permutation's order, padded to 16 with its first sample
    assert samples(ranks[0], 0) == rest[:8] and samples(ranks[1], 0) == rest[8:] + first[:1]
    assert samples(old, 0) == first[:24]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_a_failed_step_trains_that_steps_batch(tmp_path: Path, sources: dict, workers: int) -> None:
    """OnExceptionCheckpoint (e.g. out of memory at step 3): the failed step's batch is the first one resumed."""
    base = {"kind": "folder", "source": sources["folder"], "workers": workers, "devices": 1}
    base["cache_dir"] = str(tmp_path / "c")
    full = records(uninterrupted(base, tmp_path))
    ckpts = tmp_path / "ck"
    run(
        {**base, "max_steps": STEPS, "record": str(tmp_path / "failed"), "ckpt_dir": str(ckpts), "raise_at": 3},
        expect_error="simulated out of memory",
    )
    failed = records(tmp_path / "failed")
    assert [r["step"] for r in failed] == [0, 1, 2]
    run(
        {**base, "max_steps": STEPS, "record": str(tmp_path / "resumed"), "ckpt_path": str(ckpts / "on_exception.ckpt")}
    )
    resumed = records(tmp_path / "resumed")
    assert resumed[0]["step"] == 3
    assert failed + resumed == full  # step 3's batch trained after resume; nothing skipped, nothing repeated


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_readme_snippet_rerun_resumes_where_it_stopped(
    tmp_path: Path, sources: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume page's snippet (docs/resume.md: fixed dirpath, ckpt_path="last"), rerun as a preempted job would."""
    script = HELPER.with_name("snippet_run.py")

    def rerun(ckpt_dir: Path, steps: int, record: Path) -> str:
        """``python snippet_run.py ...`` in a fresh process (forked from the server that has the imports)."""
        argv = [str(script), sources["folder"], str(ckpt_dir), str(steps)]
        code, output = SERVER.command(argv, tmp_path, record.with_suffix(".log"), {"FASTDATA_RECORD": str(record)})
        assert code == 0, output[-3000:]
        return output

    def lines(path: Path) -> list[dict[str, Any]]:
        return [json.loads(x) for x in path.read_text().splitlines()]

    with monkeypatch.context() as m:  # the uninterrupted reference: the same script, in this process
        m.setenv("FASTDATA_RECORD", str(tmp_path / "ref.jsonl"))
        m.syspath_prepend(str(HELPER.parent))
        m.chdir(tmp_path)
        m.setattr(sys, "argv", [str(script), sources["folder"], str(tmp_path / "ref"), "14"])
        runpy.run_path(str(script), run_name="__main__")
    first = rerun(tmp_path / "ck", 6, tmp_path / "a.jsonl")  # stops right after its checkpoint at step 6
    assert "no last checkpoint" in first  # a first run with nothing to resume says so
    second = rerun(tmp_path / "ck", 14, tmp_path / "b.jsonl")
    assert "last.ckpt" in second
    a, b = lines(tmp_path / "a.jsonl"), lines(tmp_path / "b.jsonl")
    assert [r["step"] for r in b] == list(range(6, 14))  # continues at the step where the first run stopped
    assert a + b == lines(tmp_path / "ref.jsonl")  # same epochs, batch indices and samples as one run


def swap_one_image(root: Path) -> str:
    """Remove one image and add another of another class: the same number of files. Returns the new one's path."""
    (root / "class_000" / "img_000003.jpg").unlink()
    new = root / "class_001" / "zz_added.jpg"
    shutil.copy(root / "class_002" / "img_000004.jpg", new)
    return str(new.relative_to(root))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["folder", "hdf5", "cache", "bucket"])
@pytest.mark.slow
def test_a_resume_on_changed_data_of_the_same_length_is_refused_naming_the_change(
    tmp_path: Path, s3: LocalS3, kind: str
) -> None:
    """Was: no error, and the rest of the interrupted epoch missed samples, repeated others and trained a new one.

    The folder case saves on 2 DDP ranks and resumes on 1 (elastic), as the report did; the others on 1 rank.
    """
    src = make_image_folder(tmp_path / "src", num_classes=3, per_class=13, size=(40, 30))
    cfg: dict[str, Any] = {
        "kind": kind,
        "source": str(src),
        "workers": 0,
        "devices": 1,
        "cache_dir": str(tmp_path / "c"),
    }
    if kind == "hdf5":
        cfg["source"] = str(convert_folder_to_hdf5(src, tmp_path / "a.h5", mode="encoded", processes=1, progress=False))
    if kind == "bucket":
        cfg.update(kind="folder", source=s3.url(f"changed-{tmp_path.name}"), storage_options=s3.storage_options())
        upload_folder(src, cfg["source"], s3.storage_options())
    if kind == "folder":
        cfg.update(devices=2, workers=2)
    ckpt = stopped_at(cfg, 2, tmp_path)
    added = swap_one_image(src)
    if kind == "hdf5":
        convert_folder_to_hdf5(src, tmp_path / "b.h5", mode="encoded", processes=1, progress=False)
        os.replace(tmp_path / "b.h5", tmp_path / "a.h5")
    if kind == "bucket":
        delete_objects(cfg["source"], ["class_000/img_000003.jpg"], s3.storage_options())
        upload_folder(src, cfg["source"], s3.storage_options())
    resumed = {**cfg, "devices": 1, "workers": 0, "max_steps": 8, "record": str(tmp_path / "new"), "ckpt_path": ckpt}
    code, output = RUNS(resumed)
    assert code != 0 and "The checkpoint's loader state was saved for other data than" in output, output[-3000:]
    assert "39 samples then, 39 now" in output
    if kind in ("folder", "bucket"):  # file lists: the count and the new file named
        assert "1 sample(s) of then are gone or changed" in output and added in output, output[-3000:]
    elif kind == "cache":  # the cache was rebuilt from the changed folder: its samples' labels moved
        assert "gone or changed" in output, output[-3000:]
    assert not Path(f"{tmp_path / 'new'}.rank0").exists()  # not one step trained on the wrong samples
