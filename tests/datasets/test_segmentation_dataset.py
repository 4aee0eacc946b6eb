"""The segmentation dataset (issue 63, first part): a VOC-style folder through keyed windows, in loader workers; on
scenes whose classes are their colours, every batch's masks are its images' classes; bad input named."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.masks import agreement, mask_folder
from PIL import Image

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES, make_segmentation_folder
from lightning_fastdata.segmentation.target import IGNORE_INDEX

N = len(SEGMENTATION_CLASSES)


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_segmentation_folder(tmp_path_factory.mktemp("seg") / "voc", count=14, size=(200, 150), seed=3)


@pytest.mark.timeout(120)
def test_training_batches_through_workers_hold_masks_that_follow_their_images(voc: Path) -> None:
    ds = mask_folder(voc, "train", num_classes=N, base_size=96, crop_size=64, seed=1)
    assert len(ds) == 11
    sampler = EpochSampler(len(ds), shuffle=True, seed=1)
    loader = PrefetchingDataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate_prebatched)
    agree = total = seen = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for images, masks in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 64, 64)
            assert masks.dtype == torch.uint8 and masks.shape == (images.shape[0], 64, 64)
            a, t = agreement(images, masks)
            agree, total, seen = agree + a, total + t, seen + len(images)
    assert seen == 22 and total > 10_000 and agree / total > 0.99
    # the same key, the same window on any worker: a sample rendered alone equals its batch's copy
    first = ds.__getitems__([(0, 3, 0), (0, 5, 0)])
    again = ds[(0, 5, 0)]
    assert torch.equal(first.images[1], again[0]) and torch.equal(first.labels[1], again[1])
    other = ds[(1, 5, 0)]  # another epoch: another window
    assert not torch.equal(other[1], again[1])


def test_evaluation_batches_are_at_the_base_size_padded_to_the_largest(voc: Path) -> None:
    ds = mask_folder(voc, "val", num_classes=N, train=False, base_size=90)
    images, masks = ds.__getitems__([0, 1, 2])
    sizes = []
    for k in range(3):
        with Image.open(ds.name(k)) as im:
            w, h = im.size
        s = 90 / min(w, h)
        sizes.append((round(h * s), round(w * s)))
    assert images.shape[2:] == (max(h for h, _ in sizes), max(w for _, w in sizes))
    for k, (h, w) in enumerate(sizes):
        assert (masks[k, h:, :] == IGNORE_INDEX).all() and (masks[k, :, w:] == IGNORE_INDEX).all()
        assert (images[k, :, h:, :] == 0).all() and (images[k, :, :, w:] == 0).all()
    a, t = agreement(images, masks)
    assert a / t > 0.99
    assert {int(v) for v in masks.unique()} <= set(range(N)) | {IGNORE_INDEX}


def test_bad_masks_and_missing_files_are_named(voc: Path, tmp_path: Path) -> None:
    bad = tmp_path / "voc"
    shutil.copytree(voc, bad)
    ids = (bad / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
    Image.open(bad / "SegmentationClass" / f"{ids[0]}.png").convert("RGB").save(
        bad / "SegmentationClass" / f"{ids[0]}.png"
    )
    ds = mask_folder(bad, "train", num_classes=N)
    with pytest.raises(DataError, match=rf"{ids[0]}\.png is a RGB mask: its pixels are colours, not classes"):
        ds[0]
    small = Image.open(voc / "SegmentationClass" / f"{ids[1]}.png").resize((50, 40), Image.NEAREST)
    small.save(bad / "SegmentationClass" / f"{ids[1]}.png")
    with pytest.raises(DataError, match=rf"{ids[1]}\.png is 50x40, its image .* is \d+x\d+: a mask must be"):
        ds[1]
    two = mask_folder(voc, "train", num_classes=2)  # the scenes hold classes 1..5
    with pytest.raises(DataError, match=r"holds the value [2-5], which is no class of the 2 \(num_classes=\)"):
        for i in range(len(two)):
            two[i]
    (bad / "SegmentationClass" / f"{ids[2]}.png").unlink()
    with pytest.raises(FileNotFoundError, match=rf"names '{ids[2]}', whose mask .* does not exist"):
        mask_folder(bad, "train", num_classes=N)


@pytest.mark.parametrize("layout", ["ade20k", "cityscapes"])
def test_ade20k_and_cityscapes_layouts_mean_their_own_mask_values(tmp_path: Path, layout: str) -> None:
    """ADE20K's masks hold class + 1 (0 ignored), Cityscapes' label ids (its table makes them training ids): read
    through either layout, found by ``"auto"``, the classes are the scenes' colours again."""
    root = make_segmentation_folder(tmp_path / layout, count=10, size=(120, 90), seed=4, layout=layout)
    split = "training" if layout == "ade20k" else "train"
    classes = 150 if layout == "ade20k" else 19
    ds = mask_folder(root, split, num_classes=classes, base_size=64, crop_size=48, seed=2)
    assert ds.layout == layout and len(ds) == 8
    batch = ds.__getitems__(list(range(8)))
    agree, total = agreement(batch.images, batch.labels)
    assert total > 3000 and agree / total > 0.99
    assert (batch.labels == IGNORE_INDEX).any()  # the borders (ADE20K's 0, Cityscapes' unlabelled) are ignored
    if layout == "cityscapes":  # the colour files beside the label ids are not masks; each image has its own
        assert all(ds.name(k, 1).endswith("_gtFine_labelIds.png") for k in range(len(ds)))
        assert [Path(ds.name(k)).name.split("_")[1] for k in range(8)] == [
            Path(ds.name(k, 1)).name.split("_")[1] for k in range(8)
        ]
        with pytest.raises(ValueError, match=r"\(19 classes\) maps the mask value 19 to 6: .*\(num_classes=6\)"):
            mask_folder(root, split, num_classes=6)
    # the module's default of 21 (VOC's) trained two classes no Cityscapes pixel holds, and ADE20K's 150 read as 151
    with pytest.raises(ValueError, match=rf"gives {classes} classes and num_classes is {classes + 2}: .* Give num"):
        mask_folder(root, split, num_classes=classes + 2)


def test_paired_folders_match_by_relative_path_and_stem_and_take_a_label_map(tmp_path: Path) -> None:
    src = make_segmentation_folder(tmp_path / "voc", count=6, size=(100, 80), seed=6)
    root = tmp_path / "paired"
    names = sorted(p.stem for p in (src / "JPEGImages").iterdir())
    for k, name in enumerate(names):  # nested at different depths; masks as grey PNGs holding class * 10
        sub = "a/b" if k % 2 else "c"
        (root / "pics" / sub).mkdir(parents=True, exist_ok=True)
        (root / "labels" / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "JPEGImages" / f"{name}.jpg", root / "pics" / sub / f"{name}.jpg")
        mask = np.asarray(Image.open(src / "SegmentationClass" / f"{name}.png"))
        Image.fromarray(np.where(mask == 255, 255, mask * 10).astype(np.uint8), mode="L").save(
            root / "labels" / sub / f"{name}.png"
        )
    table = {10 * k: k for k in range(N)}
    ds = mask_folder(root, "", num_classes=N, layout="paired", images_dir="pics", masks_dir="labels",
                                   label_map=table, train=False, base_size=64)  # fmt: skip
    assert len(ds) == 6 and ds.name(0).endswith("pics/a/b/" + names[1] + ".jpg")
    images, masks = ds.__getitems__(list(range(6)))
    agree, total = agreement(images, masks)
    assert total > 3000 and agree / total > 0.99
    with pytest.raises(DataError, match=r"holds the value [1-5]0, which is no class"):  # the values without the map
        mask_folder(root, "", num_classes=N, layout="paired", images_dir="pics", masks_dir="labels")[0]
    (root / "labels" / "c" / f"{names[0]}.png").unlink()
    with pytest.raises(DataError, match=rf"The image .*pics/c/{names[0]}\.jpg has no mask: expected .*labels/c/"):
        mask_folder(root, "", num_classes=N, layout="paired", images_dir="pics", masks_dir="labels")
    with pytest.raises(FileNotFoundError, match="is not a segmentation layout this package knows"):
        mask_folder(root, "", num_classes=N)


def test_paired_binary_masks_coded_0_255_are_not_silently_ignored(tmp_path: Path) -> None:
    """Binary masks coded 0/255 (the common convention) in paired folders: 255 is the ignore index, so every
    foreground pixel was dropped from the loss and metrics without a word. Now refused, naming the masks and the two
    label_maps; with label_map={0: 0, 255: 1} the foreground is class 1."""
    src = make_segmentation_folder(tmp_path / "voc", count=4, size=(60, 40), seed=3)
    root = tmp_path / "binary"
    for sub in ("images/train", "annotations/train"):
        (root / sub).mkdir(parents=True)
    for jpg in sorted((src / "JPEGImages").iterdir()):
        shutil.copy(jpg, root / "images" / "train" / jpg.name)
        mask = np.asarray(Image.open(src / "SegmentationClass" / f"{jpg.stem}.png"))
        foreground = (mask > 0) & (mask != 255)
        Image.fromarray(np.where(foreground, 255, 0).astype(np.uint8), mode="L").save(
            root / "annotations" / "train" / f"{jpg.stem}.png"
        )
    with pytest.raises(ValueError, match=r"hold only 0 and 255: binary masks .* label_map=\{0: 0, 255: 1\}"):
        mask_folder(root, "train", num_classes=2)
    ds = mask_folder(root, "train", num_classes=2, label_map={0: 0, 255: 1}, train=False, base_size=40)
    masks = ds.__getitems__(list(range(len(ds))))[1]
    assert set(torch.unique(masks).tolist()) == {0, 1, 255}  # 255: the padding of the smaller scenes
    assert (masks == 1).sum() > 300  # the objects, which the 0/255 coding had made ignored
