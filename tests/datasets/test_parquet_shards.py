"""Parquet shards (issue 62): the hubs' layout written by our converter and by pyarrow itself, indexed from the
footer and the label column, read by row group through the folder's decode path, in windows of row groups; bad
files named."""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from lightning_fastdata.convert.shards import write_parquet_shards
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.datasets.parquet_shards import ParquetShardDataset
from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.index.parquet_index import index_parquet, load_parquet_index
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.storage.local import LocalStorage
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader

KW = dict(image_size=16, seed=0)
CLASSES = ["class_000", "class_001", "class_002"]


@pytest.fixture(scope="module")
def parquet(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """3 files of row groups of 5 rows (the last ones shorter), as the hubs lay them out."""
    return write_parquet_shards(
        image_folder, tmp_path_factory.mktemp("parquet") / "train", shard_bytes=25_000, rows_per_group=5
    )


def dataset(files: list[Path], index_dir: Path, train: bool = True, **kw: object) -> ParquetShardDataset:
    return ParquetShardDataset([load_parquet_index(p, index_dir) for p in files], CLASSES, train=train, **KW, **kw)


def hub_table(index: FileIndex, rows: range, label: str = "names") -> pa.Table:
    """A table as the hubs' ``datasets`` writes it: image structs, and labels as a ClassLabel or as class names."""
    images = [{"bytes": Path(index.path(i)).read_bytes(), "path": index.relpath(i)} for i in rows]
    labels = [int(index.labels[i]) for i in rows]
    if label == "names":
        return pa.table({"image": images, "label": [index.classes[k] for k in labels]})
    meta = {"huggingface": json.dumps({"info": {"features": {"label": {"names": CLASSES, "_type": "ClassLabel"}}}})}
    return pa.table({"image": images, "label": pa.array(labels, pa.int64())}).replace_schema_metadata(meta)


def test_parquet_files_hold_every_image_once_and_read_as_the_folders_samples_bit_for_bit(
    image_folder: Path, parquet: list[Path], tmp_path: Path
) -> None:
    """The same bytes through the same decode path: the same crops, flips and labels for the same keys."""
    assert len(parquet) > 2
    assert pq.ParquetFile(parquet[0]).num_row_groups > 1
    for train in (True, False):
        folder = ImageFolderDataset(str(image_folder), train=train, **KW)
        ds = dataset(parquet, tmp_path, train)
        assert len(ds) == len(folder) == 39 and np.array_equal(ds.targets, folder.targets)
        keys = [(3, i) for i in range(len(ds))]
        a, b = folder.__getitems__(keys), ds.__getitems__(keys)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert dataset(parquet, tmp_path).describe(7) == f"{parquet[0]}:row 7 (row group 1)"


@pytest.mark.parametrize("label", ["names", "classlabel"])
def test_files_written_by_pyarrow_as_the_hubs_do_are_read_with_their_class_names(
    image_folder: Path, tmp_path: Path, label: str
) -> None:
    """pyarrow's own writer (snappy pages, dictionary encoding, the hubs' page index): labels as class-name strings
    (each file holding only some classes, named by name) or as a ClassLabel in the schema metadata."""
    from lightning_fastdata import ShardDataModule

    index = LocalStorage(str(image_folder)).list_files()
    out = tmp_path / "hub"
    out.mkdir()
    for k, rows in enumerate([range(0, 10), range(10, 39)]):  # the first file holds class_000 only
        pq.write_table(hub_table(index, rows, label), out / f"train-{k:05d}-of-00002.parquet", row_group_size=4,
                       write_page_index=True)  # fmt: skip
    dm = ShardDataModule(str(out), index_dir=str(tmp_path / "idx"), image_size=16, batch_size=8, val_fraction=0.0)
    assert dm.format == "parquet" and dm.classes == tuple(CLASSES)
    dm.setup("fit")
    ds = dm.train_dataset
    assert np.array_equal(ds.targets, index.labels)  # type: ignore[union-attr]
    labels = Counter(int(x) for _, batch in dm.train_dataloader() for x in batch)
    assert labels == Counter(index.labels.tolist())


@pytest.mark.timeout(120)
def test_an_epoch_through_workers_reads_each_row_group_once_per_window(parquet: list[Path], tmp_path: Path) -> None:
    """Windows of whole row groups, shuffled together: every sample once; a batch mixes the row groups of its window;
    each worker reads each row group of the epoch once (counted in the workers)."""
    ds = dataset(parquet, tmp_path, shuffle_buffer=10)
    assert ds.windows is not None and ds.windows.window == 2  # row groups of 5 rows
    sampler = EpochSampler(len(ds), shuffle=True, seed=0, windows=ds.windows)
    order = sampler.epoch_order().numpy()
    groups = ds._group_of[order]
    first_window = set(groups[:10].tolist())
    assert len(first_window) == 2 and sorted(order.tolist()) == list(range(len(ds)))
    assert len(set(groups[:5].tolist())) == 2  # not a run of one row group: the window's rows are shuffled
    loader = PrefetchingDataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, collate_fn=collate_prebatched)
    labels = [int(x) for _, batch in loader for x in batch]
    assert Counter(labels) == Counter(ds.targets.tolist())


def test_row_groups_are_read_once_per_window_in_one_process(parquet: list[Path], tmp_path: Path) -> None:
    ds = dataset(parquet, tmp_path, shuffle_buffer=10)
    order = EpochSampler(len(ds), shuffle=True, seed=0, windows=ds.windows).epoch_order().numpy()
    reads = count_row_group_reads(ds, order, 4)
    assert len(reads) == len(set(ds._group_of.tolist()))  # every row group read once in the epoch


def count_row_group_reads(ds: ParquetShardDataset, order: np.ndarray, batch: int) -> list[int]:
    """The row groups read (in one process) while ``ds`` serves ``order`` in batches of ``batch``."""
    reads: list[int] = []
    real = pq.ParquetFile.read_row_group

    def counting(self: pq.ParquetFile, i: int, *args: object, **kw: object) -> pa.Table:
        reads.append(i)
        return real(self, i, *args, **kw)  # type: ignore[arg-type]

    pq.ParquetFile.read_row_group = counting  # type: ignore[method-assign]
    try:
        for start in range(0, len(order), batch):
            ds.__getitems__([(0, int(i)) for i in order[start : start + batch]])
    finally:
        pq.ParquetFile.read_row_group = real  # type: ignore[method-assign]
    return reads


def test_a_full_shuffle_reads_each_row_group_once_where_they_fit(parquet: list[Path], tmp_path: Path) -> None:
    """A full shuffle (no window) draws each batch from nearly every row group: a process keeps them up to its
    budget, so each is read once an epoch (it was read again for nearly every row: 0.54x the windowed order); a
    budget smaller than the data keeps what fits, and the count-based minimum still holds."""
    from lightning_fastdata import ShardDataModule
    from lightning_fastdata.datasets.group_reads import FULL_SHUFFLE_CACHE_BYTES

    def budget(**kw: object) -> tuple[int, int]:  # the training and validation datasets' once their loaders are made
        dm = ShardDataModule(str(parquet[0].parent), index_dir=str(tmp_path / "idx"), num_workers=0, image_size=16,
                             val_fraction=0.2, **kw)  # fmt: skip
        dm.setup("fit")
        dm.train_dataloader(), dm.val_dataloader()
        return dm.train_dataset.cache_bytes, dm.val_dataset.cache_bytes  # type: ignore[union-attr]

    assert budget(shuffle_buffer=None) == (FULL_SHUFFLE_CACHE_BYTES, 0)  # evaluation reads in file order
    assert budget() == (0, 0)  # the windows read each row group once
    assert budget(epoch_size=20) == (FULL_SHUFFLE_CACHE_BYTES, 0)  # sampling's draws leave the windows
    whole = dataset(parquet, tmp_path, shuffle_buffer=None)
    groups = len(set(whole._group_of.tolist()))
    order = EpochSampler(len(whole), shuffle=True, seed=0).epoch_order().numpy()
    kept = dataset(parquet, tmp_path, shuffle_buffer=None, cache_bytes=FULL_SHUFFLE_CACHE_BYTES)
    assert len(count_row_group_reads(kept, order, 4)) == groups  # each once (numbered within their file)
    assert len(kept._kept_bytes) == groups  # type: ignore[arg-type]
    assert count_row_group_reads(kept, order, 4) == []  # a second epoch: nothing read (persistent workers)
    plain = dataset(parquet, tmp_path, shuffle_buffer=None, cache_groups=1)
    plain_reads = len(count_row_group_reads(plain, order, 4))
    assert plain_reads > 2 * groups  # what the budget saves
    one_group = max(kept._kept_bytes.values())  # type: ignore[union-attr]
    small = dataset(parquet, tmp_path, shuffle_buffer=None, cache_groups=1, cache_bytes=3 * one_group)
    assert groups < len(count_row_group_reads(small, order, 4)) < plain_reads
    assert sum(small._kept_bytes.values()) <= 3 * one_group  # type: ignore[union-attr]


def test_a_kept_index_is_reused_and_a_changed_file_is_refused(parquet: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "s.parquet"
    copy.write_bytes(parquet[0].read_bytes())
    first = load_parquet_index(copy, tmp_path / "idx")
    assert len(list((tmp_path / "idx" / "parquet-index").glob("*.npz"))) == 1
    again = load_parquet_index(copy, tmp_path / "idx")
    assert np.array_equal(again.labels, first.labels) and again.label_names == tuple(CLASSES)
    ds = ParquetShardDataset([first], CLASSES, train=False, **KW)
    copy.write_bytes(parquet[1].read_bytes())
    os.utime(copy, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    with pytest.raises(DataError, match=r"s\.parquet' changed after it was indexed"):
        ds.__getitems__([0])
    assert np.array_equal(load_parquet_index(copy, tmp_path / "idx").labels, index_parquet(parquet[1]).labels)


def test_bad_parquet_files_are_named(image_folder: Path, parquet: list[Path], tmp_path: Path) -> None:
    index = LocalStorage(str(image_folder)).list_files()
    pq.write_table(hub_table(index, range(3), "classlabel").drop_columns(["label"]), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a\.parquet has no label column 'label'; its columns are \['image'\]"):
        index_parquet(tmp_path / "a.parquet")
    pq.write_table(pa.table({"image": ["x", "y"], "label": [0, 1]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet: the image column 'image' holds string, not encoded image"):
        index_parquet(tmp_path / "b.parquet")
    pq.write_table(pa.table({"img": [b"x", b"y"], "label": pa.array([0, None], pa.int64())}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet: row 1 has no label"):
        index_parquet(tmp_path / "c.parquet", image_column="img")
    whole = parquet[0].read_bytes()
    (tmp_path / "d.parquet").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"d\.parquet is not a readable Parquet file"):
        index_parquet(tmp_path / "d.parquet")


def test_a_corrupt_or_null_image_is_named_or_skipped(image_folder: Path, tmp_path: Path) -> None:
    jpeg = Path(LocalStorage(str(image_folder)).list_files().path(0)).read_bytes()
    table = pa.table({"image": pa.array([jpeg, b"not a jpeg", None], pa.binary()), "label": [0, 1, 1]})
    pq.write_table(table, tmp_path / "bad.parquet")
    files = [index_parquet(tmp_path / "bad.parquet")]
    with pytest.raises(OSError, match=r"bad\.parquet:row 1 \(row group 0\)"):
        ParquetShardDataset(files, ["x", "y"], train=False, **KW).__getitems__([0, 1])
    skipping = ParquetShardDataset(files, ["x", "y"], train=False, on_corrupt="skip", max_corrupt_fraction=1.0, **KW)
    images, got = skipping.__getitems__([0, 1, 2])[:2]
    assert got.tolist() == [0] and images.shape[0] == 1 and skipping.skipped_count() == 2


@pytest.mark.timeout(180)
def test_the_module_serves_the_folder_modules_batches_and_refuses_a_state_of_another_window(
    image_folder: Path, parquet: list[Path], tmp_path: Path
) -> None:
    """Without windows (a full shuffle) the same training and validation batches as ImageFolderDataModule, through
    2 workers; with windows, a loader state resumes only the same windows (shuffle_buffer changed: refused)."""
    from lightning_fastdata import ImageFolderDataModule, MixedDataModule, ShardDataModule

    kw = dict(image_size=16, batch_size=8, num_workers=2, val_fraction=0.2, seed=1)
    ours = ShardDataModule(str(parquet[0].parent), index_dir=str(tmp_path), shuffle_buffer=None, **kw)
    ours.setup("fit")
    folder = ImageFolderDataModule(str(image_folder), **kw)
    folder.setup("fit")
    assert ours.classes == folder.classes
    for a, b in zip([list(ours.train_dataloader()), list(ours.val_dataloader())],
                    [list(folder.train_dataloader()), list(folder.val_dataloader())]):  # fmt: skip
        assert len(a) == len(b) > 0
        assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    windowed = ShardDataModule(str(parquet[0].parent), index_dir=str(tmp_path), shuffle_buffer=10, **kw)
    windowed.setup("fit")
    loader = windowed.train_dataloader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = ShardDataModule(str(parquet[0].parent), index_dir=str(tmp_path), shuffle_buffer=20, **kw)
    other.setup("fit")
    with pytest.raises(ValueError, match="another order .*shuffle_buffer"):
        other.train_dataloader().load_state_dict(state)
    mix = MixedDataModule([ShardDataModule(str(parquet[0].parent), index_dir=str(tmp_path), val_fraction=0.0),
                           ImageFolderDataModule(str(image_folder), val_fraction=0.0)],
                          epoch_size=48, image_size=16, batch_size=16, num_workers=2)  # fmt: skip
    mix.setup("fit")
    assert sum(len(batch) for _, batch in mix.train_dataloader()) == 48


def test_the_hubs_datasets_library_reads_our_parquet_as_its_own(parquet: list[Path], tmp_path: Path) -> None:
    """Our converter writes the hubs' layout: `datasets` sees an Image column and a ClassLabel with our names."""
    datasets = pytest.importorskip("datasets")
    hub = datasets.load_dataset("parquet", data_files=[str(p) for p in parquet], split="train", cache_dir=str(tmp_path))
    assert len(hub) == 39 and hub.features["label"].names == CLASSES
    assert type(hub.features["image"]).__name__ == "Image"
    first = hub[0]
    ours = pq.read_table(parquet[0]).slice(0, 1).to_pylist()[0]
    assert (
        first["label"] == ours["label"] and first["image"].size == Image.open(io.BytesIO(ours["image"]["bytes"])).size
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_the_entropy_index_of_shards_is_keyed_per_sample_and_changes_no_pixel(
    image_folder: Path, parquet: list[Path], tmp_path: Path, fmt: str
) -> None:
    """entropy_index=True: every training sample's entry built from the shards (prepare_data), each sample's crop
    decoded with it: the same batches as without, through 2 workers; a rewritten shard gives another list."""
    from lightning_fastdata import ShardDataModule
    from lightning_fastdata.convert.shards import write_tar_shards
    from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available

    if not entropy_index_available():
        pytest.skip("this install has no compiled JPEG decoder (the entropy index needs it)")
    source = parquet[0].parent if fmt == "parquet" else write_tar_shards(image_folder, tmp_path / "t", 20_000)[0].parent
    kw = dict(index_dir=str(tmp_path / "idx"), image_size=24, batch_size=8, num_workers=2, val_fraction=0.2, seed=3)
    with_index = ShardDataModule(str(source), entropy_index=True, **kw)
    with_index.prepare_data()
    with_index.setup("fit")
    train = with_index.train_dataset
    assert train.entropy_indexes is not None  # type: ignore[union-attr]
    entries = [train.entropy_index_of(i) for i in range(len(train))]  # type: ignore[union-attr]
    assert all(e for e in entries) and len(set(entries)) == len(entries)  # one of its own for every photo
    without = ShardDataModule(str(source), entropy_index=False, **kw)
    without.setup("fit")
    assert without.train_dataset.entropy_indexes is None  # type: ignore[union-attr]
    a, b = list(with_index.train_dataloader()), list(without.train_dataloader())
    assert len(a) == len(b) > 0 and all(torch.equal(x[0], y[0]) for x, y in zip(a, b))


@pytest.mark.timeout(180)
def test_sampling_settings_draw_from_parquet_rows_as_from_a_folder(
    image_folder: Path, parquet: list[Path], tmp_path: Path
) -> None:
    """sample_weights, epoch_size and classes= on Parquet shards: the folder module's draws, label for label (the
    draws are a function of the labels and the seed), read row group by row group through 2 workers."""
    from lightning_fastdata import ImageFolderDataModule, ShardDataModule

    kw = dict(image_size=16, batch_size=8, num_workers=2, val_fraction=0.0, seed=5, sample_weights="balanced",
              epoch_size=30, classes=["class_002", "class_000"])  # fmt: skip
    ours = ShardDataModule(str(parquet[0].parent), index_dir=str(tmp_path), **kw)
    folder = ImageFolderDataModule(str(image_folder), **kw)
    for dm in (ours, folder):
        dm.setup("fit")
    a, b = list(ours.train_dataloader()), list(folder.train_dataloader())
    assert sum(len(x[1]) for x in a) == 30 and {int(v) for x in a for v in x[1]} <= {0, 1}
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_the_hubs_no_label_is_never_a_class(image_folder: Path, tmp_path: Path) -> None:
    """The hubs' ClassLabel -1 ("no label", as their test splits ship) was read as the last class (numpy's -1 index):
    a split of such rows is refused for training and evaluation, naming the file and how many rows lack a label, and
    still predicts (its rows carry their positions, no label)."""
    from lightning_fastdata import ShardDataModule

    index = LocalStorage(str(image_folder)).list_files()
    out = tmp_path / "hub"
    out.mkdir()
    table = hub_table(index, range(0, 10), "classlabel")
    unlabelled = table.set_column(1, "label", pa.array([-1] * 10, pa.int64()))
    pq.write_table(unlabelled, out / "test-00000-of-00001.parquet", row_group_size=4)
    with pytest.raises(ValueError, match=r"test-00000-of-00001.parquet.*10 rows have no label \(-1"):
        dataset([out / "test-00000-of-00001.parquet"], tmp_path, train=False)
    predict = dataset([out / "test-00000-of-00001.parquet"], tmp_path, train=False, labelled=False)
    assert predict.targets.tolist() == list(range(10))
    dm = ShardDataModule(str(out), index_dir=str(tmp_path / "idx"), image_size=16, batch_size=4, val_fraction=0.0)
    with pytest.raises(ValueError, match="have no label"):
        dm.setup("fit")


def test_files_written_class_after_class_are_warned_about_and_shuffled_ones_are_not(tmp_path: Path) -> None:
    """20 classes of 8 images written in listing order (our converter's default, class after class) in row groups of
    4: windows of 16 rows draw a few classes per batch of 16 where a full shuffle draws about 11, and setup says so
    with both numbers; the same images written with --shuffle train without the warning."""
    import warnings

    from lightning_fastdata import ShardDataModule
    from lightning_fastdata.cli import main
    from lightning_fastdata.demos import make_image_folder

    folder = make_image_folder(tmp_path / "folder", num_classes=20, per_class=8, size=(24, 16))
    kw: dict = dict(image_size=16, batch_size=16, val_fraction=0.0, shuffle_buffer=16, num_workers=0)
    sorted_files = write_parquet_shards(folder, tmp_path / "sorted", rows_per_group=4)
    with pytest.warns(UserWarning, match=r"draw \d\.\d classes per batch of 16, where a full shuffle would draw 1\d"):
        ShardDataModule(str(sorted_files[0].parent), index_dir=str(tmp_path / "idx"), **kw).setup("fit")
    main(["convert", "shards", "--src", str(folder), "--dst", str(tmp_path / "mixed"), "--format", "parquet",
          "--rows-per-group", "4", "--shuffle"])  # fmt: skip
    mixed = ShardDataModule(str(tmp_path / "mixed"), index_dir=str(tmp_path / "idx"), **kw)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*classes per batch")
        mixed.setup("fit")
    labels = sorted(int(x) for _, batch in mixed.train_dataloader() for x in batch)
    assert labels == sorted(k for k in range(20) for _ in range(8))  # every image once, shuffled on disk


def test_row_groups_larger_than_a_window_are_warned_about(image_folder: Path, tmp_path: Path) -> None:
    """A file written with pyarrow's or pandas' defaults holds one row group for the whole file: every window then
    reads and keeps it whole (3.1x slower, measured in issue 69); setup says so, naming the size and the fix."""
    from lightning_fastdata import ShardDataModule

    index = LocalStorage(str(image_folder)).list_files()
    (tmp_path / "whole").mkdir()
    pq.write_table(hub_table(index, range(39), "classlabel"), tmp_path / "whole" / "train.parquet")  # one row group
    kw: dict = dict(index_dir=str(tmp_path / "idx"), image_size=16, batch_size=8, val_fraction=0.0, shuffle_buffer=16)
    with pytest.warns(UserWarning, match=r"row groups of up to 39 rows .* than a window .* about 100 rows"):
        ShardDataModule(str(tmp_path / "whole"), **kw).setup("fit")


def test_a_file_changed_since_indexed_is_refused_and_its_handle_closed(image_folder: Path, tmp_path: Path) -> None:
    """The one local Parquet opener (every reader's): the file checked against its index, nothing left open when not."""
    from lightning_fastdata.loading.index.parquet_index import open_parquet

    path = write_parquet_shards(image_folder, tmp_path / "pq", shard_bytes=1 << 30, rows_per_group=8)[0]
    index = index_parquet(path)
    open_parquet(index).close()  # as indexed: opened
    with open(path, "ab") as f:
        f.write(b"appended")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(DataError, match="changed|indexed"):
            open_parquet(index)
    assert len(os.listdir("/proc/self/fd")) == before
