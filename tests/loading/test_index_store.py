"""The persisted file index: reused without listing a folder, rebuilt (and named) when it cannot be trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading import atomic
from lightning_fastdata.loading.index import store as index_store
from lightning_fastdata.loading.index.files import scan_image_folder
from lightning_fastdata.loading.index.store import FORMAT, IndexStore


def _age(root: Path, seconds: float = 60.0) -> None:
    """Make every folder's mtime older than the racy window (data written just now is not trusted)."""
    past = time.time() - seconds
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(d, (past, past))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = make_image_folder(tmp_path / "data", num_classes=3, per_class=4, size=(24, 16))
    (root / "class_001" / "nested").mkdir()
    (root / "class_001" / "nested" / "deep.jpg").write_bytes((root / "class_001" / "img_000000.jpg").read_bytes())
    _age(root)
    return root


def _same(a, b) -> None:  # noqa: ANN001
    assert a.classes == b.classes and a.root == b.root
    assert [a.relpath(i) for i in range(len(a))] == [b.relpath(i) for i in range(len(b))]
    assert np.array_equal(a.labels, b.labels)


def test_second_lookup_reuses_the_index_without_listing_any_folder(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, lookup = IndexStore(tmp_path / "idx").folder(str(tree))
    assert not lookup.reused and lookup.why is None and IndexStore(tmp_path / "idx").folder_path(str(tree)).exists()
    _same(first, scan_image_folder(str(tree)))

    def no_listing(*args: object) -> None:
        raise AssertionError("a reused index lists no folder")

    monkeypatch.setattr(os, "listdir", no_listing)
    monkeypatch.setattr(os, "scandir", no_listing)
    second, lookup = IndexStore(tmp_path / "idx").folder(str(tree), first.classes)
    assert lookup.reused
    _same(second, first)


@pytest.mark.parametrize("change", ["add", "remove", "rename", "nested"])
def test_a_changed_folder_is_named_and_rescanned(tree: Path, tmp_path: Path, change: str) -> None:
    IndexStore(tmp_path / "idx").folder(str(tree))
    victim = tree / "class_002" / "img_000001.jpg"
    if change == "add":
        (tree / "class_002" / "new.jpg").write_bytes(victim.read_bytes())
    elif change == "remove":
        victim.unlink()
    elif change == "rename":
        victim.rename(victim.with_name("zzz.jpg"))
    else:
        (tree / "class_001" / "nested" / "deep.jpg").unlink()
    index, lookup = IndexStore(tmp_path / "idx").folder(str(tree))
    changed = "nested" if change == "nested" else "class_002"
    assert not lookup.reused and changed in lookup.why and "changed" in lookup.why
    _same(index, scan_image_folder(str(tree)))  # the fresh list, never the stale one


def test_folders_modified_just_before_the_scan_are_scanned_again_without_a_warning(tmp_path: Path) -> None:
    """A folder written within RACY_SECONDS of the scan cannot prove by its mtime that nothing was added in the same
    instant: it is scanned again next time, said at info level (``how``), not warned (``why``): routine right
    after data is made, as in tests and benchmarks (33 of the suite's warnings were these)."""
    fresh = make_image_folder(tmp_path / "fresh", num_classes=2, per_class=2, size=(16, 16))  # written just now
    IndexStore(tmp_path / "idx").folder(str(fresh))
    _, lookup = IndexStore(tmp_path / "idx").folder(str(fresh))
    assert not lookup.reused and lookup.why is None
    assert lookup.how is not None and "modified within 2 s before the last scan" in lookup.how
    _age(fresh)
    IndexStore(tmp_path / "idx").folder(str(fresh))
    assert IndexStore(tmp_path / "idx").folder(str(fresh))[1].reused


def _rewrite_meta(path: Path, **changes: object) -> None:
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta.update(changes)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "newer_format", "other_tree", "inconsistent"])
def test_a_bad_index_file_is_named_and_rebuilt(tree: Path, tmp_path: Path, damage: str) -> None:
    idx = tmp_path / "idx"
    IndexStore(idx).folder(str(tree))
    path = IndexStore(idx).folder_path(str(tree))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"not an index")
    elif damage == "newer_format":
        _rewrite_meta(path, format=FORMAT + 1)
    elif damage == "other_tree":
        _rewrite_meta(path, root=str(tmp_path / "elsewhere"))
    else:
        _rewrite_meta(path, files=5)
    index, lookup = IndexStore(idx).folder(str(tree))
    expected = {
        "truncated": "unreadable",
        "garbage": "unreadable",
        "newer_format": f"format {FORMAT + 1}",
        "other_tree": "elsewhere",
        "inconsistent": "inconsistent",
    }[damage]
    assert not lookup.reused and str(path) in lookup.why and expected in lookup.why
    _same(index, scan_image_folder(str(tree)))
    assert IndexStore(idx).folder(str(tree))[1].reused  # rewritten whole


def test_new_class_folder_invalidates(tree: Path, tmp_path: Path) -> None:
    IndexStore(tmp_path / "idx").folder(str(tree))
    (tree / "class_003").mkdir()
    (tree / "class_003" / "a.jpg").write_bytes((tree / "class_000" / "img_000000.jpg").read_bytes())
    index, lookup = IndexStore(tmp_path / "idx").folder(str(tree))
    assert not lookup.reused and "class folders" in lookup.why and len(index.classes) == 4


def test_a_failed_write_leaves_no_index_and_no_temporary_file(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dies_halfway(fh, **arrays: object) -> None:  # noqa: ANN001
        fh.write(b"PK\x03\x04 half an index")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index_store.np, "savez", dies_halfway)
    index, lookup = IndexStore(tmp_path / "idx").folder(str(tree))
    assert "could not write" in lookup.why and "No space left" in lookup.why
    assert list((tmp_path / "idx").iterdir()) == []  # neither the index nor its temporary file
    _same(index, scan_image_folder(str(tree)))


def test_an_unwritable_index_dir_still_trains_on_a_fresh_scan(tree: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    index, lookup = IndexStore(blocker / "idx").folder(str(tree))
    assert not lookup.reused and "could not write" in lookup.why
    _same(index, scan_image_folder(str(tree)))


def test_index_dir_inside_the_data_folder_is_refused(tree: Path) -> None:
    with pytest.raises(ValueError, match="never writes to"):
        ImageFolderDataModule(str(tree), index_dir=str(tree / "idx"))
    assert not (tree / "idx").exists()


def test_datamodule_prepares_once_then_every_setup_reuses(
    tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kw = dict(index_dir=str(tmp_path / "idx"), image_size=16, batch_size=4, num_workers=0, val_fraction=0.25)
    dm = ImageFolderDataModule(str(tree), **kw)
    dm.prepare_data()
    assert IndexStore(tmp_path / "idx").folder_path(str(tree)).exists()
    caplog.clear()  # prepare_data reads the list again for the entropy index ("auto"): count the setups only
    with caplog.at_level("INFO"):
        dm.setup("fit")
        other_rank = ImageFolderDataModule(str(tree), **kw)
        other_rank.setup("fit")
    assert caplog.text.count("reused the file index") == 2
    assert len(dm.train_dataset) + len(dm.val_dataset) == 13
    assert [dm.train_dataset.index.relpath(i) for i in range(len(dm.train_dataset))] == [
        other_rank.train_dataset.index.relpath(i) for i in range(len(other_rank.train_dataset))
    ]


KILLED_WRITER = """
import os, sys
from lightning_fastdata.loading import atomic
from lightning_fastdata.loading.index import store as index_store
def killed(src, dst):
    os._exit(3)  # as SIGKILL: no exception handler, no cleanup
atomic.os.replace = killed
index_store.IndexStore(sys.argv[2]).folder(sys.argv[1])
"""


def test_a_writer_killed_mid_write_leaves_no_index(tree: Path, tmp_path: Path) -> None:
    idx = tmp_path / "idx"
    died = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tree), str(idx)], timeout=120)
    assert died.returncode == 3
    path = IndexStore(idx).folder_path(str(tree))
    assert not path.exists() and len(list(idx.glob(".*.tmp"))) == 1  # the whole file exists only under its tmp name
    leftover = next(idx.glob(".*.tmp"))
    # a live writer on another host (a shared file system): kept until it has not been touched for an hour
    foreign = leftover.with_name(f".{path.name}.otherhost-{os.getpid()}.tmp")
    foreign.write_bytes(b"partial")
    _, lookup = IndexStore(idx).folder(str(tree))
    assert not lookup.reused and lookup.why is None  # no index yet: a plain first scan
    assert not leftover.exists() and foreign.exists()  # this host's dead writer's file went at once
    assert IndexStore(idx).folder(str(tree))[1].reused
    old = time.time() - 2 * atomic.STALE_SECONDS
    os.utime(foreign, (old, old))
    (tree / "class_000" / "img_000000.jpg").unlink()  # changed: the next lookup rewrites, and clears the leftover
    IndexStore(idx).folder(str(tree))
    assert not foreign.exists()
