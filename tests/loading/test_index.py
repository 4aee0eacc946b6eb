from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
from torchvision import datasets
from torchvision.datasets import ImageFolder

from lightning_fastdata import ImageFolderDataset, scan_image_folder
from lightning_fastdata.demos import make_image_folder


def test_labels_and_order_match_torchvision(image_folder: Path) -> None:
    index = scan_image_folder(str(image_folder))
    reference = ImageFolder(str(image_folder))
    assert list(index.classes) == reference.classes
    assert [(index.path(i), int(index.labels[i])) for i in range(len(index))] == reference.samples


def test_nested_folders_and_uppercase_extensions(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=2, size=(32, 24))
    sub = root / "class_001" / "nested"
    sub.mkdir()
    shutil.copy(next(root.glob("class_001/*.jpg")), sub / "X.JPG")
    index = scan_image_folder(str(root))
    assert [(index.path(i), int(index.labels[i])) for i in range(len(index))] == ImageFolder(str(root)).samples


def test_index_is_compact_and_cheap_to_pickle(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=50, size=(16, 16))
    index = scan_image_folder(str(root))
    payload = pickle.dumps(index)
    # numpy arrays, not a list of Python objects: ~path length + 16 bytes per file, one memcpy to pickle
    assert len(payload) < 100 * (len(index.relpath(0)) + 16) + 2000
    assert index.labels.dtype.kind == "i" and index.path_bytes.dtype.name == "uint8"
    assert pickle.loads(payload).path(57) == index.path(57)


def test_stray_files_are_skipped_with_one_warning_that_counts_them(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=3, size=(16, 16))
    (root / "class_000" / "notes.txt").write_text("x")
    (root / "class_001" / ".DS_Store").write_bytes(b"\0")
    (root / "class_001" / "readme.txt").write_text("x")
    with pytest.warns(UserWarning, match=r"Skipped 3 file\(s\).*\.ds_store \(1\).*\.txt \(2\)"):
        index = scan_image_folder(str(root))
    assert len(index) == 6


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does-not-exist.*one\\s+sub-folder per class"):
        scan_image_folder(str(tmp_path / "does-not-exist"))


def test_no_class_folder(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        scan_image_folder(str(tmp_path))


def test_empty_class_is_named(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=2, size=(16, 16))
    (root / "empty_class").mkdir()
    (root / "empty_class" / "x.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="empty_class"):
        scan_image_folder(str(root))


def test_non_utf8_file_names_are_indexed_and_read(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "d", num_classes=2, per_class=2, size=(40, 30))
    odd = os.fsdecode(b"caf\xff.jpg")  # not UTF-8: a surrogate-escaped name, as os.listdir returns it
    os.replace(root / "class_000" / "img_000000.jpg", root / "class_000" / odd)
    index = scan_image_folder(str(root))
    assert len(index) == 4 and odd in {os.path.basename(index.path(i)) for i in range(4)}
    ds = ImageFolderDataset(index, image_size=16)
    assert ds.__getitems__(list(range(4)))[0].shape == (4, 3, 16, 16)
    torchvision_names = {os.path.basename(p) for p, _ in datasets.ImageFolder(str(root)).samples}
    assert {os.path.basename(index.path(i)) for i in range(4)} == torchvision_names


def test_directory_symlink_loop_is_indexed_once_with_a_warning(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "d", num_classes=2, per_class=2, size=(40, 30))
    os.symlink("..", root / "class_000" / "loop")  # class_000/loop -> d: would index everything again and again
    with pytest.warns(UserWarning, match=r"class_000/loop.*contains it"):
        index = scan_image_folder(str(root))
    assert len(index) == 4


def test_leaf_folders_listed_by_name_keep_torchvisions_order_links_and_cases(tmp_path: Path) -> None:
    """A class folder with no sub-folder (link count 2) is read with a plain listdir: same result as torchvision."""
    root = make_image_folder(tmp_path / "r", num_classes=2, per_class=3, size=(16, 16))
    extra = make_image_folder(tmp_path / "extra", num_classes=1, per_class=2, size=(16, 16))
    leaf = root / "class_000"
    one = next(leaf.glob("*.jpg"))
    shutil.copy(one, leaf / "Mixed.Jpg")  # neither all-lower nor all-upper case
    shutil.copy(one, leaf / "b.jpeg")
    os.symlink(extra / "class_000", leaf / "linked")  # a symlink to a folder: not counted in the link count
    (leaf / "notes.txt").write_text("x")
    assert os.stat(leaf).st_nlink == 2  # the listdir path is the one under test
    with pytest.warns(UserWarning, match=r"Skipped 1 file"):
        index = scan_image_folder(str(root))
    assert [(index.path(i), int(index.labels[i])) for i in range(len(index))] == ImageFolder(str(root)).samples
    assert any("linked" in index.relpath(i) for i in range(len(index)))


def test_subset_is_the_selected_rows_in_order(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "r", num_classes=3, per_class=5, size=(16, 16))
    index = scan_image_folder(str(root))
    rows = [14, 0, 7, 7, 3]
    sub = index.subset(rows)
    assert [sub.relpath(i) for i in range(len(sub))] == [index.relpath(i) for i in rows]
    assert sub.labels.tolist() == index.labels[rows].tolist()
    assert len(index.subset([])) == 0
