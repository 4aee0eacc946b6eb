"""``fastdata convert segmentation``: any layout, local or in a bucket, as tar shards, Parquet or one HDF5 file whose
masks hold the classes; SegmentationDataModule reads each with no table and gets the folder's batches bit for bit.
Destinations already holding shards, the data folder itself, masks of many sizes in HDF5 and values that are no class
are refused, named."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from benchmarks.s3_server import LocalS3, upload_folder
from lightning_fastdata.cli import main
from lightning_fastdata.convert.shards import write_tar_shards
from lightning_fastdata.datamodules.segmentation import SegmentationDataModule
from lightning_fastdata.errors import DataError
from lightning_fastdata.segmentation.convert import convert_segmentation, write_segmentation_shards
from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES, make_segmentation_folder
from lightning_fastdata.segmentation.layouts import CONVERTED_MASKS

N = len(SEGMENTATION_CLASSES)


def batches(root: str | Path, tmp: Path, splits: tuple[str, str], num_classes: int, **kw: object) -> list:
    dm = SegmentationDataModule(
        str(root), num_classes=num_classes, base_size=64, crop_size=48, batch_size=4, num_workers=2, seed=1,
        index_dir=str(tmp / "idx"), train_split=splits[0], val_split=splits[1], **kw,
    )  # fmt: skip
    dm.setup("fit")
    return list(dm.train_dataloader()) + list(dm.val_dataloader())


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["ade20k", "cityscapes"])
def test_converted_shards_hold_the_classes_and_give_the_folders_batches(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ADE20K's masks hold class + 1, Cityscapes' label ids: the shards hold the classes, so the module reads them
    with no layout table and gets the batches the folder gives through its table (before: the values were copied
    and read as classes, ADE20K's off by one)."""
    root = make_segmentation_folder(tmp_path / layout, count=12, size=(100, 80), seed=5, layout=layout)
    splits = ("training", "validation") if layout == "ade20k" else ("train", "val")
    classes = 150 if layout == "ade20k" else 19
    main(["convert", "segmentation", "--src", str(root), "--dst", str(tmp_path / "shards"), "--shard-size", "20kB"])
    out = capsys.readouterr().out
    assert f"{splits[0]}: " in out and f"{splits[1]}: " in out
    shards = sorted((tmp_path / "shards" / splits[0]).glob("shard-*.tar"))
    assert len(shards) > 1
    with tarfile.open(shards[0]) as tf:
        names = tf.getnames()
        mask = np.asarray(Image.open(tf.extractfile(names[1])))  # type: ignore[arg-type]
    assert names[1].endswith(".seg.png") and set(np.unique(mask)) <= set(range(N)) | {255}
    assert_same(batches(root, tmp_path, splits, classes), batches(tmp_path / "shards", tmp_path, splits, classes))


@pytest.mark.timeout(300)
def test_voc_to_parquet_and_one_size_scenes_to_hdf5_give_the_folders_batches(tmp_path: Path) -> None:
    """VOC's palette masks are copied byte for byte (their indices are the classes); scenes of one size go into one
    HDF5 file, a group per split; scenes of many sizes cannot, and the error names two masks and the way out."""
    voc = make_segmentation_folder(tmp_path / "voc", count=12, size=(96, 72), seed=2, fixed_size=True)
    written = convert_segmentation(voc, tmp_path / "pq", "parquet", shard_bytes=15_000, rows_per_group=2)
    assert sorted(written) == ["train", "val"] and len(written["train"]) > 1
    import pyarrow.parquet as pq

    first = pq.read_table(written["train"][0]).column("annotation")[0].as_py()
    assert first["bytes"] == (voc / "SegmentationClass" / first["path"]).read_bytes()
    folder = batches(voc, tmp_path, ("train", "val"), N)
    assert_same(folder, batches(tmp_path / "pq", tmp_path, ("train", "val"), N, shuffle_buffer=None))
    h5 = convert_segmentation(voc, tmp_path / "scenes.h5", "hdf5")["train"][0]
    with h5py.File(h5) as f:
        assert f["train/masks"].shape == (10, 72, 96) and len(f["val/images"]) == 2
    assert_same(folder, batches(h5, tmp_path, ("train", "val"), N))
    varied = make_segmentation_folder(tmp_path / "varied", count=6, size=(96, 72), seed=3)
    with pytest.raises(ValueError, match=r"scene_\d+\.png is \d+x\d+, .*scene_\d+\.png \d+x\d+: one HDF5 split .*"
                       r"Write tar shards or Parquet"):  # fmt: skip
        convert_segmentation(varied, tmp_path / "varied.h5", "hdf5")
    assert not (tmp_path / "varied.h5").exists() and not list(tmp_path.glob(".varied.h5*"))


@pytest.mark.timeout(300)
def test_a_bucket_converts_to_the_same_shards_as_its_folder(s3: LocalS3, tmp_path: Path) -> None:
    """From ``s3://`` (configured by the environment, as users run it): the same shard bytes as from the folder."""
    voc = make_segmentation_folder(tmp_path / "voc", count=8, size=(80, 60), seed=4)
    url = s3.url(f"seg-convert-{tmp_path.name}")
    upload_folder(voc, url, s3.storage_options())
    convert_segmentation(voc, tmp_path / "local", splits=["train"], progress=False)
    cmd = [sys.executable, "-m", "lightning_fastdata.cli", "convert", "segmentation", "--src", url, "--dst",
           str(tmp_path / "remote"), "--splits", "train"]  # fmt: skip
    out = subprocess.run(cmd, env={**os.environ, **s3.env()}, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    local, remote = sorted((tmp_path / "local" / "train").iterdir()), sorted((tmp_path / "remote" / "train").iterdir())
    assert [p.name for p in local] == [p.name for p in remote] == ["shard-000000.tar"]
    assert local[0].read_bytes() == remote[0].read_bytes()
    assert s3.secret_access_key not in out.stdout + out.stderr


def test_shards_are_never_mixed_with_older_ones_nor_written_into_the_data(tmp_path: Path) -> None:
    """A destination holding shards is refused (a reader would take old and new together); --overwrite replaces them
    and removes the old ones beyond the new count. The same for image-folder shards."""
    voc = make_segmentation_folder(tmp_path / "voc", count=10, size=(80, 60), seed=1)
    dst = tmp_path / "s"
    many = write_segmentation_shards(voc, "train", dst, shard_bytes=5_000)
    assert len(many) > 2
    with pytest.raises(FileExistsError, match=r"already holds \d+ shard\(s\) .*overwrite=True"):
        write_segmentation_shards(voc, "train", dst)
    one = write_segmentation_shards(voc, "train", dst, overwrite=True)
    assert sorted(dst.iterdir()) == one and len(one) == 1
    with tarfile.open(one[0]) as tf:
        assert len(tf.getnames()) == 2 * 8
    with pytest.raises(ValueError, match="is inside the data folder"):
        write_segmentation_shards(voc, "train", voc / "shards")
    assert not (voc / "shards").exists()
    folder = tmp_path / "folder"
    for c in ("a", "b"):
        (folder / c).mkdir(parents=True)
        for k in range(3):
            Image.new("RGB", (8, 8), (k, 0, 0)).save(folder / c / f"{k}.jpg")
    write_tar_shards(folder, tmp_path / "t", shard_bytes=100)
    with pytest.raises(SystemExit, match="already holds 6 shard"):
        main(["convert", "shards", "--src", str(folder), "--dst", str(tmp_path / "t")])
    main(["convert", "shards", "--src", str(folder), "--dst", str(tmp_path / "t"), "--overwrite"])
    assert [p.name for p in sorted((tmp_path / "t").glob("*.tar"))] == ["shard-000000.tar"]


def test_masks_that_hold_no_class_and_unknown_classes_are_errors_at_conversion(tmp_path: Path) -> None:
    voc = make_segmentation_folder(tmp_path / "voc", count=5, size=(80, 60), seed=6)
    with pytest.raises(DataError, match=r"scene_\d+\.png holds the value [2-5], which is no class of the 2"):
        convert_segmentation(voc, tmp_path / "a", splits=["train"], num_classes=2)
    assert not list((tmp_path / "a").rglob("*.tar"))
    paired = tmp_path / "paired"
    (paired / "images" / "train").mkdir(parents=True)
    (paired / "annotations" / "train").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(paired / "images" / "train" / "x.jpg")
    Image.new("L", (8, 8)).save(paired / "annotations" / "train" / "x.png")
    with pytest.raises(SystemExit, match=r"give num_classes= \(--num-classes\) .* \(the paired layout does not fix"):
        main(["convert", "segmentation", "--src", str(paired), "--dst", str(tmp_path / "b")])
    with pytest.raises(SystemExit, match=r"--label-map '7' is neither a table's name \(ade20k, .*\) nor a JSON"):
        main(["convert", "segmentation", "--src", str(paired), "--dst", str(tmp_path / "b"), "--label-map", "7"])
    with pytest.raises(SystemExit, match="has none of the splits train, val"):
        main(["convert", "segmentation", "--src", str(paired / "images"), "--dst", str(tmp_path / "c")])


@pytest.mark.timeout(300)
def test_hub_parquet_keeping_ade20ks_values_reads_with_its_named_table(tmp_path: Path) -> None:
    """The hubs' ADE20K Parquet keeps ADE20K's values (0 other, k class k - 1): ``label_map="ade20k"`` reads it as the
    ADE20K folder is read; without it, the first value the classes cannot hold is named."""
    root = make_segmentation_folder(tmp_path / "ade", count=10, size=(100, 80), seed=8, layout="ade20k")
    raw = {k: k for k in range(256) if k != 255}  # the values as they are: what the hubs' files hold
    convert_segmentation(root, tmp_path / "hub", "parquet", label_map=raw, progress=False)
    splits = ("training", "validation")
    folder = batches(root, tmp_path, splits, 150)
    ours = batches(tmp_path / "hub", tmp_path, splits, 150, shuffle_buffer=None)
    with pytest.raises(ValueError, match="written by `fastdata convert segmentation`: its masks already hold classes"):
        batches(tmp_path / "hub", tmp_path, splits, 150, label_map="ade20k", shuffle_buffer=None)
    for path in (tmp_path / "hub").rglob("*.parquet"):  # as the hubs write them: no mark of ours
        table = pq.read_table(path)
        meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != CONVERTED_MASKS.encode()}
        pq.write_table(table.replace_schema_metadata(meta), path, row_group_size=4)
    assert_same(folder, batches(tmp_path / "hub", tmp_path, splits, 150, label_map="ade20k", shuffle_buffer=None))
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(folder, ours))  # unmarked: a named table is the user's call
    shifted = batches(tmp_path / "hub", tmp_path, splits, 255, shuffle_buffer=None)  # read as classes: k, not k - 1
    assert not torch.equal(folder[0][1], shifted[0][1])
    with pytest.raises(ValueError, match=r"label_map='ade': .* \('ade20k', 'cityscapes'\)"):
        batches(tmp_path / "hub", tmp_path, splits, 150, label_map="ade")


@pytest.mark.timeout(300)
def test_a_named_table_on_masks_the_converter_wrote_as_classes_is_refused(s3: LocalS3, tmp_path: Path) -> None:
    """Our converter writes ADE20K's masks as classes (its table applied) and marks the Parquet and HDF5 files so:
    label_map="ade20k" on them applied the table again, every class shifted by one, silently; now refused, and
    without it they read as the folder does."""
    root = make_segmentation_folder(
        tmp_path / "ade", count=10, size=(100, 80), seed=8, layout="ade20k", fixed_size=True
    )
    splits = ("training", "validation")
    folder = batches(root, tmp_path, splits, 150)
    convert_segmentation(root, tmp_path / "pq", "parquet", progress=False)
    h5 = convert_segmentation(root, tmp_path / "one.h5", "hdf5", progress=False)["training"][0]
    for converted in (tmp_path / "pq", h5):
        with pytest.raises(ValueError, match="its masks already hold classes .* leave label_map out"):
            batches(converted, tmp_path, splits, 150, label_map="ade20k", shuffle_buffer=None)
    url = s3.url("marked")  # the same files in a bucket: the mark read through the kept index, as a local file's
    upload_folder(tmp_path / "pq", url, s3.storage_options())
    with pytest.raises(ValueError, match="its masks already hold classes .* leave label_map out"):
        batches(url, tmp_path, splits, 150, label_map="ade20k", layout="parquet", storage_options=s3.storage_options())
    assert_same(folder, batches(tmp_path / "pq", tmp_path, splits, 150, shuffle_buffer=None))
