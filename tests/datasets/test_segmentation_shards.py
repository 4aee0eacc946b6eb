"""Segmentation from tar shards (issue 63): image and mask members of one key, read together; the shards' batches
equal the folder's they were written from (same windows, through 2 workers), locally and in a bucket; bad shards
named."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch
from helpers.masks import agreement

from benchmarks.s3_server import LocalS3, upload_folder
from lightning_fastdata.datamodules.segmentation import SegmentationDataModule
from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.tar_pairs import index_paired_tar
from lightning_fastdata.segmentation.convert import write_segmentation_shards
from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES, make_segmentation_folder

N = len(SEGMENTATION_CLASSES)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("seg-shards")
    voc = make_segmentation_folder(tmp / "voc", count=15, size=(100, 80), seed=7)
    shards = tmp / "shards"
    for split in ("train", "val"):
        write_segmentation_shards(voc, split, shards / split, shard_bytes=20_000)
    return voc, shards


def module(root: str, tmp: Path, **kw: object) -> SegmentationDataModule:
    args: dict = dict(num_classes=N, base_size=64, crop_size=48, batch_size=4, num_workers=2, seed=1,
                      index_dir=str(tmp / "idx"))  # fmt: skip
    args.update(kw)
    return SegmentationDataModule(root, **args)


def batches(dm: SegmentationDataModule) -> list:
    dm.setup("fit")
    return list(dm.train_dataloader()) + list(dm.val_dataloader())


@pytest.mark.timeout(240)
def test_shards_serve_the_folders_batches_locally_and_from_a_bucket(
    data: tuple[Path, Path], tmp_path: Path, s3: LocalS3
) -> None:
    voc, shards = data
    assert len(list((shards / "train").glob("*.tar"))) > 2
    folder = batches(module(str(voc), tmp_path))
    local = batches(module(str(shards), tmp_path))  # layout "auto": train/ and val/ hold .tar shards
    url = s3.url(f"seg-shards-{tmp_path.name}")
    upload_folder(shards, url, s3.storage_options())
    options = s3.storage_options()
    # a full shuffle (a request a scene): the folder's order, bit for bit
    bucket = batches(module(url, tmp_path, layout="shards", storage_options=options, shuffle_buffer=None))
    assert len(folder) == len(local) == len(bucket) == 4  # 12 training scenes in 3 batches, 3 validation in 1
    for a, b, c in zip(folder, local, bucket):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "local shards differ from the folder"
        assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]), "shards in a bucket differ from the folder"
    # the default shuffle_buffer: runs of members, one request each, shuffled in windows; masks follow their images
    runs = module(url, tmp_path, layout="shards", storage_options=options, shuffle_buffer=4)
    runs.setup("fit")
    loader = runs.train_dataloader()
    assert runs.train_dataset.block_reads and loader.sampler.windows is not None  # type: ignore[union-attr]
    assert sorted(k[1] for k in loader.sampler) == list(range(12))
    agree = total = 0
    for images, masks in loader:
        a, t = agreement(images, masks)
        agree, total = agree + a, total + t
    assert total > 3000 and agree / total > 0.99


def test_a_sample_without_a_mask_and_a_truncated_shard_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("a.jpg", b"x" * 10), ("a.seg.png", b"y" * 5), ("b.jpg", b"z" * 7)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"bad\.tar: sample 'b' has no mask member \(\.seg\.png\)"):
        index_paired_tar(path)
    good = tmp_path / "good.tar"
    with tarfile.open(good, "w") as tf:
        for name, data in (("a.jpg", b"x" * 600), ("a.seg.png", b"y" * 700)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    index = index_paired_tar(good)
    assert index.keys == ("a",) and index.images[0, 1] == 600 and index.masks[0, 1] == 700
    good.write_bytes(good.read_bytes()[:1500])
    with pytest.raises(DataError, match="good.tar"):
        index_paired_tar(good)


@pytest.mark.timeout(240)
def test_parquet_files_serve_the_folders_batches_and_shuffle_in_windows_of_row_groups(
    data: tuple[Path, Path], tmp_path: Path, s3: LocalS3
) -> None:
    """The hubs' layout (``image`` and ``annotation`` structs): with a full shuffle, the folder's batches bit for bit,
    locally and from a bucket; in windows of row groups, every row once an epoch and masks that follow images."""
    from lightning_fastdata.segmentation.convert import write_segmentation_parquet

    voc, _ = data
    parquet = tmp_path / "parquet"
    for split in ("train", "val"):
        write_segmentation_parquet(voc, split, parquet / split, shard_bytes=20_000, rows_per_group=2)
    folder = batches(module(str(voc), tmp_path))
    local = batches(module(str(parquet), tmp_path, shuffle_buffer=None))
    url = s3.url(f"seg-parquet-{tmp_path.name}")
    upload_folder(parquet, url, s3.storage_options())
    bucket = batches(module(url, tmp_path, layout="parquet", shuffle_buffer=None, storage_options=s3.storage_options()))
    for a, b, c in zip(folder, local, bucket, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "local Parquet differs from the folder"
        assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]), "Parquet in a bucket differs from the folder"
    windowed = module(str(parquet), tmp_path, shuffle_buffer=4)
    windowed.setup("fit")
    keys = [k[1] for k in windowed.train_dataloader().sampler]
    assert sorted(keys) == list(range(12)) and keys != sorted(keys)
    agree = total = 0
    for images, masks in windowed.train_dataloader():
        a, t = agreement(images, masks)
        agree, total = agree + a, total + t
    assert total > 3000 and agree / total > 0.99
    with pytest.raises(DataError, match="has no mask column 'mask'; its columns are"):
        batches(module(str(parquet), tmp_path, mask_column="mask", num_workers=0))


@pytest.mark.timeout(240)
def test_predict_reads_shards_parquet_and_hdf5_and_writes_masks_named_after_their_inputs(
    data: tuple[Path, Path], tmp_path: Path
) -> None:
    """``predict_root`` as tar shards or Parquet files written from a folder: the same masks as predicting from the
    folder's images (the same bytes decoded), named ``shard/key.png`` and ``file/row.png``; an HDF5 file's decoded
    images: a mask per image at its size, named ``file/000003.png``."""
    import csv

    from PIL import Image

    from lightning_fastdata import ImageSegmenter, MaskWriter
    from lightning_fastdata.segmentation.convert import write_segmentation_parquet
    from lightning_fastdata.segmentation.demos import make_segmentation_hdf5
    from lightning_fastdata.testing import cpu_trainer

    voc, shards = data
    write_segmentation_parquet(voc, "train", tmp_path / "parquet", shard_bytes=20_000, rows_per_group=2)
    h5 = make_segmentation_hdf5(tmp_path / "scans.h5", count=4, size=(70, 50), groups=False)
    torch.manual_seed(0)
    model = ImageSegmenter(N, model=torch.nn.Conv2d(3, N, 1))
    written: dict[str, list[list[str]]] = {}
    for name, root in (("folder", voc / "JPEGImages"), ("shards", shards / "train"), ("parquet", tmp_path / "parquet"),
                       ("hdf5", h5)):  # fmt: skip
        out = tmp_path / f"masks-{name}"
        dm = module(str(voc), tmp_path, predict_root=str(root), num_workers=2)
        cpu_trainer(MaskWriter(str(out))).predict(model, datamodule=dm, return_predictions=False)
        with open(out / "predictions.csv", newline="") as f:
            written[name] = list(csv.reader(f))[1:]
    train = (voc / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
    folder = {Path(p).stem: m for p, m in written["folder"]}
    for name in ("shards", "parquet"):
        assert len(written[name]) == len(train) == 12
        for k, (path, mask) in enumerate(written[name]):
            expected = (tmp_path / "masks-folder" / folder[train[k]]).read_bytes()
            assert (tmp_path / f"masks-{name}" / mask).read_bytes() == expected, (name, path)
    assert written["shards"][0][1] == "shard-000000/00000000.png"
    assert written["parquet"][3][1] == "part-000000/000003.png"
    assert [m for _, m in written["hdf5"]] == [f"scans/{k:06d}.png" for k in range(4)]
    assert written["hdf5"][1][0].endswith("scans.h5:images[1]")
    with Image.open(tmp_path / "masks-hdf5" / "scans" / "000002.png") as mask:
        assert mask.size == (70, 50)


@pytest.mark.timeout(240)
def test_a_cache_is_named_after_the_mask_column_it_holds(data: tuple[Path, Path], tmp_path: Path) -> None:
    """Two mask columns of one Parquet file cached in one cache_dir: each its own cache (before, the name left the
    column out and the second trained on the first's masks)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from lightning_fastdata.segmentation.convert import write_segmentation_parquet

    voc, _ = data
    parquet = tmp_path / "parquet"
    for split in ("train", "val"):
        for path in write_segmentation_parquet(voc, split, parquet / split, shard_bytes=1 << 30, rows_per_group=4):
            table = pq.read_table(path)
            sizes = [Image.open(io.BytesIO(v["bytes"])).size for v in table.column("annotation").to_pylist()]
            blank = []
            for w, h in sizes:
                out = io.BytesIO()
                Image.fromarray(np.zeros((h, w), np.uint8), mode="L").save(out, format="PNG")
                blank.append({"bytes": out.getvalue(), "path": None})
            pq.write_table(table.append_column("blank", pa.array(blank, table.schema.field("annotation").type)), path,
                           row_group_size=4)  # fmt: skip
    cache = str(tmp_path / "cache")
    kw = dict(shuffle_buffer=None, cache_dir=cache, num_workers=0)
    first = module(str(parquet), tmp_path, mask_column="annotation", **kw)
    first.prepare_data()
    masks = torch.cat([b[1].flatten() for b in batches(first)])
    assert ((masks > 0) & (masks < 255)).any()
    second = module(str(parquet), tmp_path, mask_column="blank", **kw)
    second.prepare_data()
    masks = torch.cat([b[1].flatten() for b in batches(second)])
    assert not ((masks > 0) & (masks < 255)).any()  # background and padding only: the blank column's own masks
    assert len(list(Path(cache).glob("mask-*"))) == 4  # two splits, two columns
