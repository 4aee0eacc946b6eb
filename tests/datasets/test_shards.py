"""Tar shards (issue 62, first part): written from a folder, indexed by their headers, read by random access through
the folder's decode path; a changed, truncated or unlabelled shard named."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_fastdata.convert.shards import write_tar_shards
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.datasets.shards import TarShardDataset
from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.tar_index import index_tar, load_tar_index
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader

KW = dict(image_size=16, seed=0)


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_tar_shards(image_folder, tmp_path_factory.mktemp("shards") / "train", shard_bytes=20_000)


def dataset(shards: list[Path], index_dir: Path, train: bool = True) -> TarShardDataset:
    classes = json.loads((shards[0].parent / "classes.json").read_text())
    return TarShardDataset([load_tar_index(p, index_dir) for p in shards], classes, train=train, **KW)


def test_shards_hold_every_image_once_with_its_label_in_the_listings_order(
    image_folder: Path, shards: list[Path], tmp_path: Path
) -> None:
    folder = ImageFolderDataset(str(image_folder), train=True, **KW)
    ds = dataset(shards, tmp_path)
    assert len(shards) > 2 and len(ds) == len(folder) == 39 and ds.classes == folder.classes
    assert np.array_equal(ds.targets, folder.targets)
    with tarfile.open(shards[0]) as tf:
        assert tf.getnames()[:2] == ["00000000.jpg", "00000000.cls"]
    assert ds.describe(0) == f"{shards[0]}:00000000"


def test_a_shard_sample_is_the_folders_sample_bit_for_bit(
    image_folder: Path, shards: list[Path], tmp_path: Path
) -> None:
    """The same bytes through the same decode path: the same crops, flips and labels for the same keys."""
    for train in (True, False):
        folder = ImageFolderDataset(str(image_folder), train=train, **KW)
        ds = dataset(shards, tmp_path, train)
        keys = [(3, i) for i in range(len(ds))]
        a, b = folder.__getitems__(keys), ds.__getitems__(keys)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.timeout(120)
def test_an_epoch_through_workers_reads_every_sample_once_in_a_global_shuffle(
    shards: list[Path], tmp_path: Path
) -> None:
    ds = dataset(shards, tmp_path)
    sampler = EpochSampler(len(ds), shuffle=True, seed=0)
    loader = PrefetchingDataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, collate_fn=collate_prebatched)
    labels = [int(x) for _, batch in loader for x in batch]
    assert Counter(labels) == Counter(ds.targets.tolist())
    first = [k[1] for k in list(sampler)[:8]]
    assert len({int(ds._shard_of[i]) for i in first}) > 1  # one batch draws from several shards


def test_a_kept_index_is_reused_and_a_changed_shard_indexed_again_never_misread(
    shards: list[Path], tmp_path: Path
) -> None:
    copy = tmp_path / "s.tar"
    copy.write_bytes(shards[0].read_bytes())
    first = load_tar_index(copy, tmp_path / "idx")
    assert len(list((tmp_path / "idx" / "tar-index").glob("*.npz"))) == 1
    again = load_tar_index(copy, tmp_path / "idx")
    assert again.keys == first.keys and np.array_equal(again.offsets, first.offsets)
    ds = TarShardDataset([first], ["class_000", "class_001", "class_002"], train=False, **KW)
    # the shard rewritten after indexing (another shard's content): the reader refuses it, naming it
    copy.write_bytes(shards[1].read_bytes())
    os.utime(copy, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    with pytest.raises(DataError, match=r"s\.tar' changed after it was indexed"):
        ds.__getitems__([0])
    rebuilt = load_tar_index(copy, tmp_path / "idx")  # another size/mtime: indexed again
    assert rebuilt.keys == index_tar(shards[1]).keys and rebuilt.keys != first.keys


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_bad_shards_are_named_with_their_member(shards: list[Path], tmp_path: Path) -> None:
    jpeg = tarfile.open(shards[0]).extractfile("00000000.jpg").read()  # type: ignore[union-attr]
    no_label = _tar(tmp_path / "a.tar", [("x/k1.jpg", jpeg), ("x/k1.cls", b"1"), ("x/k2.jpg", jpeg)])
    with pytest.raises(DataError, match=r"a\.tar: sample 'x/k2' has no label member"):
        index_tar(no_label)
    two = _tar(tmp_path / "b.tar", [("k1.jpg", jpeg), ("k1.png", jpeg), ("k1.cls", b"0")])
    with pytest.raises(DataError, match=r"member 'k1\.png': sample 'k1' has two image members"):
        index_tar(two)
    words = _tar(tmp_path / "c.tar", [("k1.jpg", jpeg), ("k1.cls", b"cat")])
    with pytest.raises(DataError, match="the label is not an integer"):
        index_tar(words)
    as_json = _tar(tmp_path / "d.tar", [("k1.JPEG", jpeg), ("k1.json", b'{"label": 2, "w": 5}')])
    assert index_tar(as_json).labels.tolist() == [2]  # ImageNet's upper-case extension, a JSON label
    whole = shards[0].read_bytes()
    (tmp_path / "e.tar").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"e\.tar (is truncated|is not a readable uncompressed tar shard)"):
        index_tar(tmp_path / "e.tar")


def test_shard_patterns_expand_in_order(shards: list[Path]) -> None:
    from lightning_fastdata.datamodules.shards import expand_shards

    folder = shards[0].parent
    assert expand_shards(str(folder)) == [str(p) for p in shards]
    braces = str(folder / f"shard-{{000000..{len(shards) - 1:06d}}}.tar")
    assert expand_shards(braces) == [str(p) for p in shards]
    assert expand_shards([str(folder / "shard-00000[01].tar")]) == [str(p) for p in shards[:2]]
    with pytest.raises(FileNotFoundError, match=r"The shard .*shard-000998\.tar. \(of .*\) does not exist"):
        expand_shards(str(folder / "shard-{000998..000999}.tar"))


@pytest.mark.timeout(180)
def test_the_shard_module_serves_the_folder_modules_batches_and_resumes_its_loader(
    image_folder: Path, shards: list[Path], tmp_path: Path
) -> None:
    """The same samples in the same order: the same training and validation batches as ImageFolderDataModule (the
    sampler's permutation and every crop are functions of the seed and the sample's number), through 2 workers, and
    the loader's own state resumes it mid-epoch."""
    from lightning_fastdata import ImageFolderDataModule, ShardDataModule

    kw = dict(image_size=16, batch_size=8, num_workers=2, val_fraction=0.2, seed=1)
    ours = ShardDataModule(str(shards[0].parent), index_dir=str(tmp_path), **kw)
    ours.prepare_data()
    ours.setup("fit")
    folder = ImageFolderDataModule(str(image_folder), **kw)
    folder.setup("fit")
    assert ours.classes == folder.classes and ours.num_classes == 3
    for a, b in zip([list(ours.train_dataloader()), list(ours.val_dataloader())],
                    [list(folder.train_dataloader()), list(folder.val_dataloader())]):  # fmt: skip
        assert len(a) == len(b) > 0
        assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    loader = ours.train_dataloader()
    it = iter(loader)
    first = [next(it)[1].clone() for _ in range(2)]
    state = loader.state_dict()
    del it
    again = ShardDataModule(str(shards[0].parent), index_dir=str(tmp_path), **kw)
    again.setup("fit")
    resumed = again.train_dataloader()
    resumed.load_state_dict(state)
    rest = [b[1] for b in resumed]
    whole = [b[1] for b in ours.train_dataloader()]
    assert all(torch.equal(x, y) for x, y in zip(first + rest, whole)) and len(first + rest) == len(whole)


@pytest.mark.timeout(180)
def test_shards_join_a_mix_and_a_corrupt_member_is_skipped_or_named(
    image_folder: Path, shards: list[Path], tmp_path: Path
) -> None:
    """A shard source in a MixedDataModule beside a folder (one class space by name); a member whose bytes are not
    an image is named (``on_corrupt="raise"``) or skipped and counted (``"skip"``), as a corrupt file is."""
    from lightning_fastdata import ImageFolderDataModule, MixedDataModule, ShardDataModule

    kw: dict = dict(image_size=16, val_fraction=0.0)
    mix = MixedDataModule([ShardDataModule(str(shards[0].parent), index_dir=str(tmp_path), **kw),
                           ImageFolderDataModule(str(image_folder), **kw)],
                          epoch_size=64, image_size=16, batch_size=16, num_workers=2)  # fmt: skip
    assert mix.classes == ("class_000", "class_001", "class_002")
    mix.setup("fit")
    labels = Counter(int(x) for _, batch in mix.train_dataloader() for x in batch)
    assert sum(labels.values()) == 64 and set(labels) <= {0, 1, 2}
    jpeg = tarfile.open(shards[0]).extractfile("00000000.jpg").read()  # type: ignore[union-attr]
    bad = _tar(tmp_path / "bad.tar", [("a.jpg", jpeg), ("a.cls", b"0"), ("b.jpg", b"not a jpeg"), ("b.cls", b"1")])
    index = index_tar(bad)
    with pytest.raises(OSError, match=r"bad\.tar:b"):
        TarShardDataset([index], ["x", "y"], train=False, **KW).__getitems__([0, 1])
    skipping = TarShardDataset([index], ["x", "y"], train=False, on_corrupt="skip", max_corrupt_fraction=1.0, **KW)
    images, got = skipping.__getitems__([0, 1])[:2]
    assert got.tolist() == [0] and images.shape[0] == 1 and skipping.skipped_count() == 1


@pytest.mark.slow  # over 7 s on the 2-core VM (the project's rule: over ~4 s is the slow tier)
def test_shards_written_by_webdatasets_own_writer_are_read_with_their_labels(
    image_folder: Path, tmp_path: Path
) -> None:
    """webdataset.ShardWriter's shards (its key and member naming, its tar headers) read as ours are."""
    wds = pytest.importorskip("webdataset")
    from lightning_fastdata import ShardDataModule
    from lightning_fastdata.loading.storage.local import LocalStorage

    index = LocalStorage(str(image_folder)).list_files()
    (tmp_path / "wds").mkdir()
    with wds.ShardWriter(str(tmp_path / "wds" / "train-%06d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(len(index)):
            sink.write(
                {"__key__": f"sample{i:06d}", "jpg": Path(index.path(i)).read_bytes(), "cls": int(index.labels[i])}
            )
    dm = ShardDataModule(str(tmp_path / "wds"), index_dir=str(tmp_path / "idx"), class_names=list(index.classes),
                         image_size=16, batch_size=8, val_fraction=0.0, num_workers=0, shuffle=False)  # fmt: skip
    dm.setup("fit")
    assert len(dm.shard_paths) == 4 and np.array_equal(dm.train_dataset.targets, index.labels)  # type: ignore[union-attr]
    folder = ImageFolderDataset(str(image_folder), train=False, **KW)
    ours = TarShardDataset(dm.train_dataset.shards, index.classes, train=False, **KW)  # type: ignore[union-attr]
    keys = [(0, i) for i in range(len(ours))]
    assert torch.equal(folder.__getitems__(keys)[0], ours.__getitems__(keys)[0])


@pytest.mark.slow  # 10 s on the 2-core VM: the project's rule sends tests over 7 s to the full run
def test_numbered_classes_come_from_every_shard_not_the_first(image_folder: Path, tmp_path: Path) -> None:
    """webdataset's ShardWriter shards sorted so that the first holds labels 0-1 and the second 0-2 (no names, no
    classes.json): every shard's labels are in the index, so the classes are 0-2 (before: '2, outside the 2 classes'
    at setup, read from the first shard alone)."""
    wds = pytest.importorskip("webdataset")
    from lightning_fastdata import ShardDataModule
    from lightning_fastdata.loading.storage.local import LocalStorage

    index = LocalStorage(str(image_folder)).list_files()
    order = sorted(range(len(index)), key=lambda i: int(index.labels[i]))
    (tmp_path / "wds").mkdir()
    with wds.ShardWriter(str(tmp_path / "wds" / "train-%06d.tar"), maxcount=20, verbose=0) as sink:
        for i in order:
            sink.write({"__key__": f"s{i:06d}", "jpg": Path(index.path(i)).read_bytes(), "cls": int(index.labels[i])})
    dm = ShardDataModule(str(tmp_path / "wds"), index_dir=str(tmp_path / "idx"), image_size=16, batch_size=8,
                         val_fraction=0.0, num_workers=0)  # fmt: skip
    assert dm.classes == ("0", "1", "2")
    dm.setup("fit")
    assert sorted(dm.train_dataset.targets.tolist()) == sorted(index.labels.tolist())  # type: ignore[union-attr]


@pytest.mark.timeout(120)
@pytest.mark.slow  # over 7 s on the 2-core VM (14 s, 10 s in session 23): the full run's
def test_a_shard_cut_short_keeps_its_whole_samples_with_on_corrupt_skip(shards: list[Path], tmp_path: Path) -> None:
    """One shard cut in the middle (an interrupted copy): with on_corrupt="skip" the samples whole before the cut and
    every other shard train, warned with the count (before: 'not a readable uncompressed tar shard' stopped the run);
    with "raise", it is still named."""
    from lightning_fastdata import ShardDataModule

    folder = tmp_path / "cut"
    folder.mkdir()
    for p in shards:
        shutil.copy(p, folder / p.name)
    shutil.copy(shards[0].parent / "classes.json", folder / "classes.json")
    whole = [len(index_tar(p)) for p in shards]
    cut = folder / shards[1].name
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 100])
    kw: dict = dict(index_dir=str(tmp_path / "idx"), image_size=16, batch_size=4, val_fraction=0.0, num_workers=2)
    with pytest.raises(DataError, match=rf"{cut.name} is cut short .* pass on_corrupt=.skip."):
        ShardDataModule(str(folder), **kw).setup("fit")
    with pytest.warns(UserWarning, match=rf"{cut.name} is cut short .* its first \d+ samples, whole, are read"):
        dm = ShardDataModule(str(folder), on_corrupt="skip", **kw)
        dm.setup("fit")
    served = sum(len(b[1]) for b in dm.train_dataloader())
    assert sum(whole) - whole[1] < served < sum(whole)


def test_a_shard_packed_again_in_another_order_with_the_same_size_and_time_is_indexed_again(
    shards: list[Path], tmp_path: Path
) -> None:
    """The same members packed again in another order (the same size), its time set back (``cp -p``, reproducible
    builds): a kept index trusted by path, size and time read other samples under the old offsets; the kept index
    now checks a digest of member headers and is built again."""
    copy = tmp_path / "s.tar"
    copy.write_bytes(shards[0].read_bytes())
    first = load_tar_index(copy, tmp_path / "idx")
    with tarfile.open(shards[0]) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    pairs = [members[i : i + 2] for i in range(0, len(members), 2)][::-1]
    with tarfile.open(copy, "w", format=tarfile.GNU_FORMAT) as tf:
        for member, data in (m for pair in pairs for m in pair):
            tf.addfile(member, io.BytesIO(data))
    os.utime(copy, ns=(first.mtime_ns, first.mtime_ns))
    assert copy.stat().st_size == first.size and copy.stat().st_mtime_ns == first.mtime_ns
    again = load_tar_index(copy, tmp_path / "idx")
    assert again.keys == first.keys[::-1]
    assert np.array_equal(again.labels, first.labels[::-1])
