"""Boxes follow their images exactly, from COCO, VOC and YOLO folders, through workers and every recipe.

The demo scenes' rectangles are filled with their class's colour and never overlap, so after any window a box's
interior (away from its edges, where a resize blends colours) is its class's colour, and every pixel of a class's
colour lies in a box of that class: a box moved by another map than its pixels' fails both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.restored import rest_and_restored

from lightning_fastdata.detection.datamodule import DetectionDataModule
from lightning_fastdata.detection.demos import DETECTION_CLASSES, make_detection_folder
from lightning_fastdata.detection.target import BoxBatch
from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.segmentation.demos import classes_of_colours


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("detection")
    return {layout: make_detection_folder(tmp / layout, count=16, layout=layout, seed=3) for layout in
            ("coco", "voc", "yolo")}  # fmt: skip


def module(root: Path, **kw: object) -> DetectionDataModule:
    args: dict = dict(batch_size=4, num_workers=2, seed=5)
    if "voc" in root.name:
        args["class_names"] = list(DETECTION_CLASSES)
    args.update(kw)
    return DetectionDataModule(str(root), **args)


def check_boxes_frame_their_pixels_of(batch: Batch, labels: dict[int, int]) -> int:
    """Every box's interior is the colour of its data class ``labels[label]`` (a subset's renumbering)."""
    checked = 0
    for image, target, (h, w) in zip(batch.images, batch.labels.targets(), batch.labels.sizes.tolist()):
        classes = classes_of_colours(image[:, :h, :w].permute(1, 2, 0).numpy())
        for box, label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            x1, y1, x2, y2 = (int(v) for v in box)
            inner = classes[y1 + 3 : max(0, y2 - 3), x1 + 3 : max(0, x2 - 3)]
            if inner.size:
                assert (inner == labels[label] + 1).mean() > 0.98, (box, label)
                checked += 1
    return checked


def check_boxes_frame_their_pixels(batch: Batch) -> int:
    """Every box's interior is its class's colour; every coloured pixel lies in a box of its class. Boxes checked.

    Away from the edges by a margin that grows with the resize (the JPEG's colour bleeds a pixel past a rectangle's
    edge in the ~120-pixel scenes, several once they are resized to 480-800).
    """
    assert isinstance(batch.labels, BoxBatch)
    checked = 0
    for image, target, (h, w) in zip(batch.images, batch.labels.targets(), batch.labels.sizes.tolist()):
        margin = max(2, int(np.ceil(1.5 * min(h, w) / 100)))
        classes = classes_of_colours(image[:, :h, :w].permute(1, 2, 0).numpy())  # 0: grey, k + 1: label k
        covered = np.zeros((h, w), np.int64)
        for box, label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            x1, y1, x2, y2 = box
            # (an end below 0 would count from the other side: a box thinner than its margins has no interior)
            inner = classes[int(np.ceil(y1)) + margin : max(0, int(y2) - margin),
                            int(np.ceil(x1)) + margin : max(0, int(x2) - margin)]  # fmt: skip
            if inner.size:
                assert (inner == label + 1).mean() > 0.98, (box, label)
                checked += 1
            covered[int(np.floor(y1)) : int(np.ceil(y2)), int(np.floor(x1)) : int(np.ceil(x2))] = label + 1
        # a pixel of a class's colour, away from the colour's edges, lies in a box of that class
        solid = classes.copy()
        for dy in (-margin, margin):
            for dx in (-margin, margin):
                solid[np.roll(np.roll(classes, dy, 0), dx, 1) != classes] = 0
        solid[:margin], solid[-margin:], solid[:, :margin], solid[:, -margin:] = 0, 0, 0, 0
        assert (covered[solid > 0] == solid[solid > 0]).all()
    return checked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("layout", ["coco", "voc", "yolo"])
def test_boxes_frame_their_pixels_through_workers_in_every_layout_and_recipe(
    folders: dict[str, Path], layout: str
) -> None:
    checked = 0
    for recipe in ("hflip", "multiscale"):
        dm = module(folders[layout], data_augmentation=recipe)
        dm.setup("fit")
        assert dm.classes == DETECTION_CLASSES and dm.num_classes == 5
        batches = list(dm.train_dataloader())
        assert sum(len(b.images) for b in batches) == 12
        for batch in batches + list(dm.val_dataloader()):
            checked += check_boxes_frame_their_pixels(batch)
        if recipe == "multiscale":  # the shorter side one of the reference's sizes (the longer within 1333)
            sizes = torch.cat([b.labels.sizes for b in batches])
            assert set(sizes.min(dim=1).values.tolist()) <= set(range(480, 801, 32))
    assert checked > 60


@pytest.mark.timeout(120)
def test_flips_are_drawn_per_sample_and_the_same_after_a_restart(folders: dict[str, Path]) -> None:
    """A sample's flip is a function of (seed, epoch, index): two modules give the same boxes, and some are flipped."""
    first, again = module(folders["coco"], num_workers=0), module(folders["coco"], num_workers=2)
    for dm in (first, again):
        dm.setup("fit")
    a, b = list(first.train_dataloader()), list(again.train_dataloader())
    assert all(torch.equal(x.labels.boxes, y.labels.boxes) and torch.equal(x.images, y.images) for x, y in zip(a, b))
    val = module(folders["coco"], num_workers=0)
    val.setup("fit")
    plain = {tuple(s) for batch in val.val_dataloader() for s in batch.labels.boxes.tolist()}
    assert plain  # the validation boxes are the annotations' as they are (no window)


def test_on_the_device_a_batch_is_what_torchvisions_detection_models_take(folders: dict[str, Path]) -> None:
    dm = module(folders["yolo"], num_workers=0)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    images, targets = dm.on_after_batch_transfer(batch, 0)
    assert len(images) == len(targets) == 4
    for image, target, (h, w) in zip(images, targets, batch.labels.sizes.tolist()):
        assert image.dtype == torch.float32 and tuple(image.shape) == (3, h, w)
        assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
        assert target["boxes"].shape == (len(target["labels"]), 4)
        assert int(target["image_id"]) == -1  # YOLO's files have no id
    # COCO's: each image's id, its stored size, each box's area in the pixels given (here a multi-scale resize)
    import json

    from PIL import Image

    coco = module(folders["coco"], num_workers=0, data_augmentation="multiscale", shuffle=False)
    coco.setup("fit")
    doc = json.loads((folders["coco"] / "annotations" / "instances_train2017.json").read_text())
    by_id = {im["id"]: im for im in doc["images"]}
    images, targets = coco.on_after_batch_transfer(next(iter(coco.train_dataloader())), 0)
    assert [int(t["image_id"]) for t in targets] == sorted(by_id)[:4]
    for t in targets:
        entry = by_id[int(t["image_id"])]
        with Image.open(folders["coco"] / "train2017" / entry["file_name"]) as im:
            assert t["orig_size"].tolist() == [im.height, im.width] == [entry["height"], entry["width"]]
        b = t["boxes"]
        assert torch.allclose(t["area"], (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))


def test_cocos_sparse_ids_become_contiguous_labels_and_bad_annotations_are_named(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    import json

    dm = module(folders["coco"], num_workers=0)
    assert dm.categories() == {1: 0, 3: 1, 5: 2, 7: 3, 9: 4}  # COCO's ids as written, labels 0 .. 4
    root = make_detection_folder(tmp_path / "bad", count=8, layout="coco", seed=1)
    ann = root / "annotations" / "instances_train2017.json"
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["bbox"] = [150.0, 10.0, 100.0, 20.0]  # past the image's right edge
    ann.write_text(json.dumps(doc))
    bad = module(root, num_workers=0, shuffle=False)
    bad.setup("fit")
    with pytest.raises(DataError, match=r"instances_train2017.json#image 1: box 0 .* lies outside its image"):
        bad.train_dataloader()  # before a batch: the annotations read for the images holding a box, by their size
    kept = module(root, num_workers=0, shuffle=False, keep_empty=True)
    kept.setup("fit")  # (keeping every image, setup reads no annotation: the first read names it)
    with pytest.raises(DataError, match=r"instances_train2017.json#image 1: box 0 .* lies outside its image"):
        list(kept.train_dataloader())
    doc["annotations"][0]["bbox"] = [1.0, 1.0, 5.0, 5.0]
    image = doc["images"][0]
    image["width"], image["height"] = image["height"], image["width"]  # an EXIF-turned photo's annotation
    ann.write_text(json.dumps(doc))
    turned = module(root, num_workers=0, shuffle=False)
    turned.setup("fit")
    with pytest.raises(DataError, match=r"annotation says its image is \d+x\d+, .* \(turned: an EXIF-rotated"):
        list(turned.train_dataloader())
    doc["annotations"][0]["bbox"] = [1.0, 1.0, 5.0, 5.0]
    doc["annotations"][0]["category_id"] = 4  # no such category
    ann.write_text(json.dumps(doc))
    unknown = module(root, num_workers=0, shuffle=False)
    unknown.setup("fit")
    with pytest.raises(DataError, match="category 4 is not one of the module's categories"):
        list(unknown.train_dataloader())


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("layout", "fmt"), [("coco", "tar"), ("yolo", "tar"), ("voc", "parquet")])
def test_shards_written_from_a_folder_give_its_batches(
    folders: dict[str, Path], tmp_path: Path, layout: str, fmt: str
) -> None:
    """The same samples from other sources (tar shards of key.jpg + key.json, Parquet files of image and objects
    columns; no detection code in either source): the same images and boxes, bit for bit, training (flips drawn
    from the keys) and validation."""
    from lightning_fastdata.detection.convert import write_detection_shards

    splits = {"coco": ("train2017", "val2017"), "yolo": ("train", "val"), "voc": ("train", "val")}[layout]
    names = list(DETECTION_CLASSES) if layout == "voc" else None
    for split, name in zip(splits, ("train", "val")):
        write_detection_shards(folders[layout], split, tmp_path / "shards" / name, class_names=names,
                               shard_bytes=40_000, fmt=fmt, rows_per_group=3)  # fmt: skip
    assert len(list((tmp_path / "shards" / "train").glob(f"*.{fmt}"))) > 1
    folder = module(folders[layout], num_workers=2)
    shards = DetectionDataModule(str(tmp_path / "shards"), batch_size=4, num_workers=2, seed=5,
                                 index_dir=str(tmp_path / "idx"), shuffle_buffer=None)  # fmt: skip
    for dm in (folder, shards):
        dm.setup("fit")
    assert shards.classes == folder.classes == DETECTION_CLASSES
    for a, b in zip(
        list(folder.train_dataloader()) + list(folder.val_dataloader()),
        list(shards.train_dataloader()) + list(shards.val_dataloader()),
        strict=True,
    ):
        assert torch.equal(a.images, b.images)
        assert all(torch.equal(x, y) for x, y in zip(a.labels, b.labels))


@pytest.mark.timeout(120)
def test_a_loader_restored_mid_epoch_gives_the_remaining_batches(folders: dict[str, Path]) -> None:
    """torchdata's state after two batches, loaded into a new module's loader: the rest of the epoch, bit for bit."""
    first = module(folders["voc"], num_workers=2, batch_size=2, data_augmentation="multiscale")
    first.setup("fit")
    loader = first.train_dataloader()
    it = iter(loader)
    seen = [next(it), next(it)]
    state = loader.state_dict()
    rest = list(it)
    again = module(folders["voc"], num_workers=2, batch_size=2, data_augmentation="multiscale")
    again.setup("fit")
    resumed = again.train_dataloader()
    resumed.load_state_dict(state)
    got = list(resumed)
    assert len(seen) + len(got) == 6 and len(got) == len(rest)
    for a, b in zip(rest, got, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.boxes, b.labels.boxes)


def test_classes_keep_the_images_holding_them_and_renumber_their_boxes(folders: dict[str, Path]) -> None:
    dm = module(folders["coco"], num_workers=0, classes=["blue", "red"], shuffle=False)
    dm.setup("fit")
    assert dm.classes == ("blue", "red") and dm.num_classes == 2
    batches = list(dm.train_dataloader())
    labels = torch.cat([b.labels.labels for b in batches])
    assert set(labels.tolist()) == {0, 1}  # blue 0, red 1; the other classes' boxes dropped
    for batch in batches:  # every image kept holds one of them
        assert all(n > 0 for n in batch.labels.counts.tolist())
        assert check_boxes_frame_their_pixels_of(batch, {0: 2, 1: 0}) > 0


@pytest.mark.timeout(180)
def test_the_square_recipes_zoom_out_crop_and_resize_with_their_boxes(folders: dict[str, Path]) -> None:
    """``"ssd"`` and ``"ssdlite"``: every image a square of the model's size, its boxes on their pixels after the
    zoom-out (onto the mean colour), the IoU crop, the flip and the resize; ``"lsj"``: the scale jitter, the
    fixed-size crop padded with the mean colour and the flip; the photometric distortion changes the image's pixels,
    never the fill or a box; the draws are the key's, whatever the workers."""
    from lightning_fastdata.detection.ssd import SSD_MEAN

    def batches(recipe: str, workers: int = 2, distort: bool = False) -> list[Batch]:
        dm = module(folders["coco"], data_augmentation=recipe, num_workers=workers)
        dm.recipe = dataclasses.replace(dm.recipe, distort=distort)
        dm.setup("fit")
        return list(dm.train_dataloader())

    mean = torch.tensor(SSD_MEAN, dtype=torch.uint8).view(3, 1, 1)
    for recipe, side in (("ssd", 300), ("ssdlite", 320)):
        plain, checked, filled = batches(recipe), 0, 0
        for batch in plain:
            assert batch.images.shape[1:] == (3, side, side)
            assert ((batch.labels.boxes >= 0) & (batch.labels.boxes <= side)).all()
            checked += check_boxes_frame_their_pixels_of(batch, dict(enumerate(range(5))))
            filled += int((batch.images == mean).all(dim=1).sum())
        assert checked > 10
        assert (filled > 0) == (recipe == "ssd")  # only ssd zooms out onto the mean colour
    lsj = module(folders["coco"], data_augmentation="lsj", image_size=160)  # the reference's 1024, scaled down
    lsj.setup("fit")
    jittered = list(lsj.train_dataloader())
    assert all(b.images.shape[1:] == (3, 160, 160) for b in jittered)
    assert sum(check_boxes_frame_their_pixels(b) for b in jittered) > 10  # every box, every coloured pixel
    assert int(sum((b.images == mean).all(dim=1).sum() for b in jittered)) > 0  # the padding: the mean colour
    painted, again = batches("ssd", distort=True), batches("ssd", workers=0, distort=True)
    plain = batches("ssd")
    changed = 0
    for p, a, q in zip(painted, again, plain, strict=True):
        assert torch.equal(p.images, a.images) and torch.equal(p.labels.boxes, a.labels.boxes)  # keyed draws
        assert torch.equal(p.labels.boxes, q.labels.boxes)  # the distortion moves no box
        fill = (q.images == mean).all(dim=1, keepdim=True).expand_as(q.images)
        assert torch.equal(p.images[fill], q.images[fill])  # nor the fill
        changed += int((p.images != q.images).any(dim=(1, 2, 3)).sum())
    assert changed >= 6  # of 12 images: each step half the time, so nearly every image is distorted


def test_the_iou_crop_keeps_a_box_centre_and_drops_the_boxes_whose_centre_it_leaves_out() -> None:
    """``RandomIoUCrop``'s rules: a crop of 0.3-1 of each side, aspect 0.5-2, holding a box's centre (an image
    without boxes is left as it is); the boxes whose centre falls outside the crop are dropped, the others clamped."""
    from lightning_fastdata.detection.ssd import iou_crop
    from lightning_fastdata.detection.target import BoxTarget
    from lightning_fastdata.sources.window import Window

    boxes = np.array([[10, 10, 60, 40], [100, 80, 180, 150], [150, 20, 190, 60]], np.float64)
    crops = [iou_crop(boxes, 200, 160, np.random.default_rng(k)) for k in range(200)]
    made = [c for c in crops if c is not None]
    assert 100 < len(made) < 200  # "as it is" is one option in seven
    for left, top, w, h in made:
        assert 0.3 * 200 - 1 <= w <= 200 and 0.3 * 160 - 1 <= h <= 160 and 0.5 <= w / h <= 2
        cx, cy = boxes[:, [0, 2]].mean(1), boxes[:, [1, 3]].mean(1)
        assert ((left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)).any()
    assert iou_crop(np.zeros((0, 4)), 200, 160, np.random.default_rng(0)) is None
    target = BoxTarget({0: 0}, 1)
    value = {"boxes": boxes.astype(np.float32), "labels": np.zeros(3, np.int64), "iscrowd": np.zeros(3, np.uint8)}
    crop = Window((0, 0, 100, 120), (0, 0, 100, 120), (100, 120), False)  # the top-left 120 x 100 pixels
    kept = target.follow(value, crop)
    centred = target.follow(value, dataclasses.replace(crop, centred=True))
    assert kept["boxes"].tolist() == [[10, 10, 60, 40], [100, 80, 120, 100]]  # clamped
    assert centred["boxes"].tolist() == [[10, 10, 60, 40]]  # the second's centre (140, 115) is outside


@pytest.mark.timeout(120)
def test_images_without_a_box_are_left_out_of_training_unless_kept_and_always_evaluated(tmp_path: Path) -> None:
    """As torchvision's reference: training leaves out the images without a box (one whose boxes are all crowds is
    empty there); ``keep_empty=True`` trains on them with ``(0, 4)`` targets; evaluation keeps every image."""
    import json
    import shutil

    root = make_detection_folder(tmp_path / "coco", count=16, layout="coco", seed=3)
    shutil.copytree(root / "train2017", root / "val_all")
    doc = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    ids = [im["id"] for im in doc["images"]]
    empty, crowded = set(ids[:3]), ids[3]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] not in empty]
    for a in doc["annotations"]:
        a["iscrowd"] = int(a["image_id"] == crowded)
    for name in ("instances_train2017.json", "instances_val_all.json"):
        (root / "annotations" / name).write_text(json.dumps(doc))

    def counts(**kw: object) -> tuple[list[int], list[int]]:
        dm = module(root, val_split="val_all", num_workers=2, **kw)
        dm.setup("fit")
        train = [n for b in dm.train_dataloader() for n in b.labels.counts.tolist()]
        val = [n for b in dm.val_dataloader() for n in b.labels.counts.tolist()]
        return train, val

    train, val = counts()
    assert len(train) == len(ids) - 4 and 0 not in train  # three without annotations, one of crowds only
    assert len(val) == len(ids) and val.count(0) == 3  # the crowds are the evaluation's
    kept, _ = counts(keep_empty=True)
    assert len(kept) == len(ids) and kept.count(0) == 4
    # the decoded cache keeps every box, crowds too: training from it leaves them out as the annotations' reader does
    assert counts(cache_dir=str(tmp_path / "cache")) == (train, val)


@pytest.mark.timeout(120)
def test_the_hubs_parquet_objects_column_reads_as_the_folder_it_came_from(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """Parquet files as the hubs ship detection sets (``image`` structs, an ``objects`` struct of COCO ``bbox`` lists
    and ``category`` ClassLabels named in the schema's metadata): the folder's images and boxes, its class names."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = folders["coco"]
    names = ["red", "green", "blue", "yellow", "magenta"]
    for split, name in (("train2017", "train"), ("val2017", "val")):
        doc = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        label = {c["id"]: k for k, c in enumerate(sorted(doc["categories"], key=lambda c: c["id"]))}
        rows = []
        for im in sorted(doc["images"], key=lambda im: im["file_name"]):
            anns = [a for a in doc["annotations"] if a["image_id"] == im["id"]]
            rows.append({"image": {"bytes": (root / split / im["file_name"]).read_bytes(), "path": im["file_name"]},
                         "objects": {"bbox": [a["bbox"] for a in anns],
                                     "category": [label[a["category_id"]] for a in anns]}})  # fmt: skip
        features = {"objects": {"feature": {"bbox": {"feature": {"dtype": "float32", "_type": "Value"},
                                                     "_type": "Sequence"},
                                            "category": {"names": names, "_type": "ClassLabel"}},
                                "_type": "Sequence"}}  # fmt: skip
        table = pa.Table.from_pylist(rows).replace_schema_metadata(
            {"huggingface": json.dumps({"info": {"features": features}})}
        )
        (tmp_path / "hub" / name).mkdir(parents=True)
        pq.write_table(table, tmp_path / "hub" / name / "part-0.parquet", row_group_size=4)
    folder = module(root, num_workers=0)
    hub = DetectionDataModule(str(tmp_path / "hub"), batch_size=4, num_workers=2, seed=5, shuffle_buffer=None,
                              index_dir=str(tmp_path / "idx"))  # fmt: skip
    for dm in (folder, hub):
        dm.setup("fit")
    assert hub.classes == folder.classes == DETECTION_CLASSES
    for a, b in zip(list(folder.val_dataloader()), list(hub.val_dataloader()), strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.labels, b.labels.labels)
        assert torch.allclose(a.labels.boxes, b.labels.boxes, atol=1e-3)
    assert sum(check_boxes_frame_their_pixels(b) for b in hub.train_dataloader()) > 10


@pytest.mark.timeout(120)
def test_a_users_v2_transform_moves_the_boxes_with_the_pixels_seeded_by_the_key(folders: dict[str, Path]) -> None:
    """``train_transforms=`` a torchvision v2 ``Compose`` (an affine move and scale, a resize): every box still frames
    its class's pixels through workers, the draws are the sample's key's (the same batches with 0 and 2 workers), and
    a transform that returns float images is named."""
    from torchvision.transforms import v2

    def batches(workers: int, transform: object) -> list[Batch]:
        dm = module(folders["coco"], num_workers=workers, train_transforms=transform)
        dm.setup("fit")
        return list(dm.train_dataloader())

    moved = v2.Compose([v2.RandomAffine(degrees=0, translate=(0.15, 0.15), scale=(0.7, 1.3)),
                        v2.RandomResize(100, 180)])  # fmt: skip
    two, zero = batches(2, moved), batches(0, moved)
    assert sum(check_boxes_frame_their_pixels(b) for b in two) > 10
    for a, b in zip(two, zero, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.boxes, b.labels.boxes)
    plain = batches(0, None)
    assert any(a.images.shape != b.images.shape or not torch.equal(a.images, b.images) for a, b in zip(two, plain))
    with pytest.raises(TypeError, match=r"train_transforms \(Compose\) should return \(uint8"):
        batches(0, v2.Compose([v2.ToDtype(torch.float32, scale=True)]))


@pytest.mark.timeout(120)
def test_a_csv_of_boxes_reads_as_the_folder_it_came_from(folders: dict[str, Path], tmp_path: Path) -> None:
    """``layout="csv"`` (told by ``train.csv``): a row a box, ``image,xmin,ymin,xmax,ymax,label``, an empty box for
    an image without one; the COCO folder's images and boxes, its classes sorted by name unless given; a bad header
    and a missing image are named."""
    import csv
    import json
    import shutil

    root, out = folders["coco"], tmp_path / "csv"
    (out / "images").mkdir(parents=True)
    names = dict(zip((1, 3, 5, 7, 9), DETECTION_CLASSES))
    for split, name in (("train2017", "train"), ("val2017", "val")):
        doc = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image", "xmin", "ymin", "xmax", "ymax", "label"])
            for im in sorted(doc["images"], key=lambda im: im["id"]):
                shutil.copy(root / split / im["file_name"], out / "images" / im["file_name"])
                anns = [a for a in doc["annotations"] if a["image_id"] == im["id"]]
                for a in anns:
                    x, y, w, h = a["bbox"]
                    writer.writerow([f"images/{im['file_name']}", x, y, x + w, y + h, names[a["category_id"]]])
                if not anns:
                    writer.writerow([f"images/{im['file_name']}", "", "", "", "", ""])
    folder = module(root, num_workers=0)
    table = DetectionDataModule(str(out), class_names=list(DETECTION_CLASSES), batch_size=4, num_workers=2, seed=5)
    for dm in (folder, table):
        dm.setup("fit")
    assert table.found_layout() == "csv" and table.classes == DETECTION_CLASSES
    for a, b in zip(list(folder.val_dataloader()), list(table.val_dataloader()), strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.labels, b.labels.labels)
        assert torch.allclose(a.labels.boxes, b.labels.boxes, atol=1e-3)
    assert sum(check_boxes_frame_their_pixels(b) for b in table.train_dataloader()) > 10
    by_name = DetectionDataModule(str(out), batch_size=4, num_workers=0)
    by_name.setup("fit")
    assert by_name.classes == tuple(sorted(DETECTION_CLASSES))
    (out / "val.csv").write_text("file,x1,y1,x2,y2,class\n")
    with pytest.raises(DataError, match=r"val\.csv: its header should be image,xmin,ymin,xmax,ymax,label"):
        DetectionDataModule(str(out), batch_size=4, num_workers=0).setup("fit")
    (out / "val.csv").write_text("image,xmin,ymin,xmax,ymax,label\nimages/nope.jpg,1,1,5,5,red\n")
    with pytest.raises(FileNotFoundError, match=r"val\.csv names 'images/nope\.jpg'"):  # the default split too
        DetectionDataModule(str(out), batch_size=4, num_workers=0).setup("fit")
    (out / "val.csv").unlink()  # no validation split at all: said, and training goes on
    with pytest.warns(UserWarning, match="No validation"):
        DetectionDataModule(str(out), batch_size=4, num_workers=0).setup("fit")


@pytest.mark.timeout(180)
def test_the_decoded_cache_gives_the_sources_batches_and_its_boxes_follow_every_recipe(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """Cached as they are, the images give the folder's batches bit for bit (training and evaluation, workers); cached
    smaller, the boxes are scaled with them and follow the square recipes' windows; the Parquet source caches too;
    a loader restored mid-epoch from the cache gives the rest of it."""

    def batches(dm: DetectionDataModule) -> list[Batch]:
        dm.prepare_data()
        dm.setup("fit")
        return list(dm.train_dataloader()) + list(dm.val_dataloader())

    cache = str(tmp_path / "cache")
    plain = batches(module(folders["coco"]))
    cached = batches(module(folders["coco"], cache_dir=cache))
    assert len(cached) == len(plain) == 4
    for a, b in zip(plain, cached, strict=True):
        assert torch.equal(a.images, b.images)
        assert all(torch.equal(x, y) for x, y in zip(a.labels, b.labels, strict=True))
    assert len(list((tmp_path / "cache").iterdir())) == 2  # a folder per split, built once by prepare_data

    for recipe in ("ssd", "lsj"):
        dm = module(folders["coco"], cache_dir=cache, cache_size=96, data_augmentation=recipe, num_workers=0)
        if recipe == "ssd":
            dm.recipe = dataclasses.replace(dm.recipe, distort=False)  # its colours are what the check reads
        small = batches(dm)
        assert small[0].images.shape[2:] == ((300, 300) if recipe == "ssd" else (1024, 1024))
        assert min(small[-1].labels.sizes.min(dim=1).values.tolist()) == 96  # evaluation: the cached images
        assert sum(check_boxes_frame_their_pixels(b) for b in small[-1:]) > 5  # every box, every coloured pixel
        # the IoU crop drops the boxes whose centre it leaves out (their pixels stay): the boxes' interiors checked
        assert sum(check_boxes_frame_their_pixels_of(b, dict(enumerate(range(5)))) for b in small[:-1]) > 10

    from lightning_fastdata.detection.convert import write_detection_shards

    for split, name in (("train2017", "train"), ("val2017", "val")):
        write_detection_shards(folders["coco"], split, tmp_path / "parquet" / name, fmt="parquet")
    parquet = module(tmp_path / "parquet", cache_dir=cache, index_dir=str(tmp_path / "index"), num_workers=0)
    from_parquet = batches(parquet)
    for a, b in zip(plain, from_parquet, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.boxes, b.labels.boxes)

    first = module(folders["coco"], cache_dir=cache, batch_size=2, data_augmentation="multiscale")
    first.setup("fit")
    loader = first.train_dataloader()
    rest, got = rest_and_restored(
        loader, lambda: module(folders["coco"], cache_dir=cache, batch_size=2, data_augmentation="multiscale")
    )
    assert len(got) == len(rest) == 5
    for a, b in zip(rest, got, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.boxes, b.labels.boxes)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ["voc", "yolo"])
def test_an_hdf5_file_converted_from_the_cli_gives_the_folders_batches(
    folders: dict[str, Path], tmp_path: Path, layout: str
) -> None:
    """``fastdata convert detection --format hdf5``: one file, a group per split of encoded images and box JSON, the
    classes in its attribute; read through workers, the folder's batches bit for bit (training and validation), and
    from its cache; a boxes dataset of another kind is named."""
    import h5py

    from lightning_fastdata.cli import main

    dst = tmp_path / "boxes.h5"
    args = ["--class-names", *DETECTION_CLASSES] if layout == "voc" else []
    main(["convert", "detection", "--src", str(folders[layout]), "--dst", str(dst), "--format", "hdf5", *args])
    with h5py.File(dst) as f:
        assert sorted(f) == ["train", "val"] and len(f["train/images"]) == 12 and len(f["val/boxes"]) == 4
    folder = module(folders[layout])
    stored = DetectionDataModule(str(dst), batch_size=4, num_workers=2, seed=5)
    cached = DetectionDataModule(str(dst), batch_size=4, num_workers=0, seed=5, cache_dir=str(tmp_path / "cache"))
    for dm in (folder, stored, cached):
        dm.prepare_data()
        dm.setup("fit")
    assert stored.classes == cached.classes == DETECTION_CLASSES
    expected = list(folder.train_dataloader()) + list(folder.val_dataloader())
    for dm in (stored, cached):
        for a, b in zip(expected, list(dm.train_dataloader()) + list(dm.val_dataloader()), strict=True):
            assert torch.equal(a.images, b.images)
            assert all(torch.equal(x, y) for x, y in zip(a.labels, b.labels, strict=True))
    import shutil

    bad = shutil.copyfile(dst, tmp_path / "bad.h5")  # (this process holds the converted file open)
    with h5py.File(bad, "a") as f:
        del f["val/boxes"]
        f["val/boxes"] = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"val/boxes.*one annotation per image"):
        DetectionDataModule(str(bad), batch_size=4, num_workers=0).setup("fit")


def test_the_photometric_distortion_gives_torchvisions_pixels(image_folder: Path) -> None:
    """``RandomPhotometricDistort``'s steps as the reference chains them (brightness, contrast before or after
    saturation and hue, the channels' order), on photos at SSD's size, channels-last as the loader renders them:
    torchvision's bytes whatever steps a sample draws (ours: lookups and the compiled hue)."""
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms.v2 import functional as F

    from lightning_fastdata.detection.ssd import _PERMUTATIONS, photometric_distort

    def reference(u: list[float], out: torch.Tensor) -> torch.Tensor:
        if u[0] < 0.5:
            out = F.adjust_brightness(out, 0.875 + 0.25 * u[1])
        contrast, before = (0.5 + u[3]) if u[2] < 0.5 else None, u[4] < 0.5
        if contrast is not None and before:
            out = F.adjust_contrast(out, contrast)
        if u[5] < 0.5:
            out = F.adjust_saturation(out, 0.5 + u[6])
        if u[7] < 0.5:
            out = F.adjust_hue(out, -0.05 + 0.1 * u[8])
        if contrast is not None and not before:
            out = F.adjust_contrast(out, contrast)
        if u[9] < 0.5:
            out = F.permute_channels(out, list(_PERMUTATIONS[min(int(u[10] * 6), 5)]))
        return out

    rng = np.random.default_rng(0)
    files = sorted(image_folder.glob("*/*.jpg"))[:8]
    for k, path in enumerate(files * 3):
        image = F.resize(decode_jpeg(read_file(str(path))), [300, 300])
        image = image.permute(1, 2, 0).contiguous().permute(2, 0, 1)
        draws = rng.random(11)
        draws[[0, 2, 5, 7]] = [(k >> bit) & 1 for bit in range(4)]  # every combination of the four colour steps
        assert torch.equal(photometric_distort(draws, image), reference(draws.tolist(), image)), k


@pytest.mark.timeout(120)
def test_aspect_ratio_groups_batch_alike_images_through_workers_and_resume_exactly(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """``aspect_ratio_group_factor=3`` (the reference's): each training batch's images in one of torchvision's
    aspect-ratio bins until the unfilled ones close the epoch, every image once; the same batches with 0 and 2
    workers and from the cache (its sizes, nothing read); a loader restored mid-epoch gives the rest. Half the scenes
    are portrait."""
    import bisect

    bins = (2 ** np.linspace(-1, 1, 7)).tolist()

    def groups(batch: Batch) -> set[int]:
        sizes = batch.labels.sizes.tolist()  # hflip keeps each image's own size, so its aspect
        return {bisect.bisect_right(bins, w / h) for h, w in sizes}

    root = make_detection_folder(tmp_path / "voc", count=32, layout="voc", seed=3, portrait=0.5)

    def epoch(factor: int = 3, **kw: object) -> list[Batch]:
        dm = module(root, aspect_ratio_group_factor=factor, batch_size=3, **kw)
        dm.prepare_data()
        dm.setup("fit")
        return list(dm.train_dataloader())

    two, none, cached = epoch(), epoch(num_workers=0), epoch(cache_dir=str(tmp_path / "cache"))
    assert len({g for b in two for g in groups(b)}) >= 3  # the scenes fall in several bins, portrait and landscape
    purity = [len(groups(b)) == 1 for b in two]
    assert purity[:5] == [True] * 5 and purity.count(False) <= 3  # at most one unfilled batch per group, at the end
    assert [len(groups(b)) == 1 for b in epoch(-1)].count(False) > 3  # (the plain order mixes them)
    assert sum(len(b.images) for b in two) == 24
    for a, b, c in zip(two, none, cached, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.images, c.images)
        assert torch.equal(a.labels.boxes, b.labels.boxes) and torch.equal(a.labels.boxes, c.labels.boxes)
    dm = module(root, aspect_ratio_group_factor=3, batch_size=3)
    dm.setup("fit")
    loader = dm.train_dataloader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = module(root, aspect_ratio_group_factor=3, batch_size=3)
    again.setup("fit")
    resumed = again.train_dataloader()
    resumed.load_state_dict(state)
    for a, b in zip(two[1:], resumed, strict=True):
        assert torch.equal(a.images, b.images)


@pytest.mark.timeout(120)
def test_a_padded_batch_holds_the_lists_images_and_trains_a_fixed_size_model(folders: dict[str, Path]) -> None:
    """``batch_format="padded"``: one tensor whose images are the lists' at the top left (0 around them, after
    normalisation), the same target dicts, each image's size; torchvision's SSDlite takes it as it is."""
    from lightning_fastdata import ObjectDetector
    from lightning_fastdata.detection.target import PaddedBoxes

    def first(fmt: str, recipe: str = "hflip") -> object:
        dm = module(folders["coco"], batch_format=fmt, num_workers=0, data_augmentation=recipe)
        dm.setup("fit")
        return dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)

    images, targets = first("lists")  # type: ignore[misc]
    padded = first("padded")
    assert isinstance(padded, PaddedBoxes) and padded.images.shape[0] == len(images)
    for k, image in enumerate(images):
        h, w = image.shape[1:]
        assert padded.image_sizes[k].tolist() == [h, w]
        assert torch.equal(padded.images[k, :, :h, :w], image)
        assert padded.images[k, :, h:].abs().sum() == 0 and padded.images[k, :, :, w:].abs().sum() == 0
        assert torch.equal(padded.targets[k]["boxes"], targets[k]["boxes"])
    square = first("padded", "ssdlite")
    model = ObjectDetector(num_classes=5, arch="ssdlite320_mobilenet_v3_large")
    loss = model.training_step(square, 0)
    assert torch.isfinite(loss) and square.images.shape[1:] == (3, 320, 320)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="batch_format"):
        module(folders["coco"], batch_format="tensor")


def check_masks_fill_their_boxes(batch: Batch, tolerance: float = 1.0) -> int:
    """Every instance mask lies on its box (its extent within ``tolerance`` pixels of the box's edges) and on its
    class's colour."""
    checked = 0
    for image, target, (h, w) in zip(batch.images, batch.labels.targets(), batch.labels.sizes.tolist()):
        classes = classes_of_colours(image[:, :h, :w].permute(1, 2, 0).numpy())
        assert target["masks"].shape == (len(target["labels"]), h, w) and target["masks"].dtype == torch.uint8
        for box, label, mask in zip(target["boxes"].tolist(), target["labels"].tolist(), target["masks"].numpy()):
            ys, xs = np.nonzero(mask)
            extent = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            assert max(abs(a - b) for a, b in zip(extent, box)) <= tolerance, (extent, box)
            inner = mask.astype(bool) & (np.roll(mask, 3, 0) > 0) & (np.roll(mask, -3, 0) > 0)
            inner &= (np.roll(mask, 3, 1) > 0) & (np.roll(mask, -3, 1) > 0)
            if inner.sum() > 4:
                assert (classes[inner] == label + 1).mean() > 0.98
                checked += 1
    return checked


@pytest.mark.timeout(240)
def test_instance_masks_follow_every_recipe_from_polygons_rle_shards_and_the_cache(tmp_path: Path) -> None:
    """``masks=True``: COCO's polygons rasterized as torchvision's reference does, each mask through the window of
    its image and box (every recipe, two workers): on its box and its class's colour. The same masks from compressed
    and uncompressed RLE, from tar shards written from the folder and from the cache; a layout without segmentation
    is named."""
    import dataclasses
    import json

    from pycocotools import mask as coco_mask

    from lightning_fastdata.detection.convert import write_detection_shards

    root = make_detection_folder(tmp_path / "coco", count=12, layout="coco", seed=3)

    def batches(where: Path, workers: int = 2, **kw: object) -> list[Batch]:
        dm = DetectionDataModule(str(where), masks=True, batch_size=3, num_workers=workers, seed=5,
                                 index_dir=str(tmp_path / "index"), **kw)  # type: ignore[arg-type]  # fmt: skip
        if kw.get("data_augmentation") == "ssd":
            dm.recipe = dataclasses.replace(dm.recipe, distort=False)  # its colours are what the check reads
        dm.prepare_data()
        dm.setup("fit")
        return list(dm.train_dataloader()) + list(dm.val_dataloader())

    plain = batches(root)
    checked = sum(check_masks_fill_their_boxes(b) for b in plain)
    for recipe, size in (("multiscale", None), ("ssd", None), ("lsj", 160)):
        checked += sum(check_masks_fill_their_boxes(b) for b in batches(root, 0, data_augmentation=recipe,
                                                                        image_size=size))  # fmt: skip
    assert checked > 60

    def same(a: list[Batch], b: list[Batch]) -> None:
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.images, y.images) and torch.equal(x.labels.masks, y.labels.masks)
            assert torch.equal(x.labels.boxes, y.labels.boxes)

    for name in ("instances_train2017.json", "instances_val2017.json"):  # the same masks as RLE, both kinds
        path = root / "annotations" / name
        doc = json.loads(path.read_text())
        sizes = {im["id"]: (im["height"], im["width"]) for im in doc["images"]}
        for k, a in enumerate(doc["annotations"]):
            h, w = sizes[a["image_id"]]
            mask = coco_mask.decode(coco_mask.frPyObjects(a["segmentation"], h, w)).any(axis=2)
            rle = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
            if k % 2:
                a["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
            else:  # uncompressed: run lengths, column by column
                flat = mask.flatten(order="F").astype(np.int64)
                edges = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
                a["segmentation"] = {"size": [h, w], "counts": np.diff(np.concatenate([[0], edges])).tolist()}
        (tmp_path / "rle" / "annotations").mkdir(parents=True, exist_ok=True)
        (tmp_path / "rle" / "annotations" / name).write_text(json.dumps(doc))
    for split in ("train2017", "val2017"):
        (tmp_path / "rle" / split).symlink_to(root / split)
    same(plain, batches(tmp_path / "rle"))
    for split, name in (("train2017", "train"), ("val2017", "val")):
        write_detection_shards(root, split, tmp_path / "shards" / name)
    same(plain, batches(tmp_path / "shards", shuffle_buffer=None))
    same(plain, batches(root, cache_dir=str(tmp_path / "cache")))
    voc = make_detection_folder(tmp_path / "voc", count=8, layout="voc", seed=3)
    with pytest.raises(DataError, match="masks=True reads each box's segmentation"):
        batches(voc, 0, class_names=list(DETECTION_CLASSES))


@pytest.mark.timeout(120)
def test_a_users_v2_transform_moves_the_instance_masks_with_the_boxes(folders: dict[str, Path]) -> None:
    """``masks=True`` with ``train_transforms``: the masks reach the user's transform as ``tv_tensors.Mask`` and come
    back on their boxes and their class's colour (an affine move and scale, then a resize)."""
    from torchvision.transforms import v2

    moved = v2.Compose([v2.RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.8, 1.2)), v2.Resize(200)])
    dm = module(folders["coco"], masks=True, train_transforms=moved, num_workers=2)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert all(min(size) == 200 for b in batches for size in b.labels.sizes.tolist())
    # (the mask resampled twice, nearest each time, the box's edges mapped exactly: two pixels apart at most)
    assert sum(check_masks_fill_their_boxes(b, tolerance=2.0) for b in batches) > 10


@pytest.mark.timeout(180)
def test_a_mix_of_detection_sources_draws_both_with_boxes_in_the_mixs_classes(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """``MixedDataModule`` of a COCO folder and tar shards of a VOC folder keeping two classes: the mix's classes by
    name, each source's boxes on their pixels in them (the VOC source's other classes' boxes dropped, its images
    without one left out), torchvision's lists on the device; a loader restored mid-epoch gives the rest."""
    from lightning_fastdata import MixedDataModule
    from lightning_fastdata.detection.convert import write_detection_shards

    for split in ("train", "val"):
        write_detection_shards(folders["voc"], split, tmp_path / "voc-shards" / split,
                               class_names=list(DETECTION_CLASSES))  # fmt: skip

    def mix() -> MixedDataModule:
        coco = module(folders["coco"])
        voc = DetectionDataModule(str(tmp_path / "voc-shards"), classes=["blue", "red"], index_dir=str(tmp_path / "i"))
        return MixedDataModule([coco, voc], weights=[1, 3], batch_size=4, num_workers=2, seed=2, epoch_size=24)

    dm = mix()
    dm.setup("fit")
    assert dm.classes == DETECTION_CLASSES  # the VOC source's two by name
    batches = list(dm.train_dataloader())
    assert sum(len(b.images) for b in batches) == 24
    checked = sum(check_boxes_frame_their_pixels_of(b, dict(enumerate(range(5)))) for b in batches)
    assert checked > 20
    counts = torch.cat([b.labels.counts for b in batches])
    assert (counts > 0).all()  # images without a box (of the kept classes) never drawn
    images, targets = dm.on_after_batch_transfer(batches[0], 0)
    assert isinstance(images, list) and {"boxes", "labels"} <= set(targets[0])
    assert len(dm.val_dataloader()) == 2
    loader = dm.train_dataloader()
    rest, restored = rest_and_restored(loader, mix)
    for a, b in zip(rest, restored, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.boxes, b.labels.boxes)


@pytest.mark.timeout(240)
def test_a_coco_folder_and_its_parquet_files_in_a_bucket_give_the_local_batches(
    folders: dict[str, Path], tmp_path: Path, s3: object
) -> None:
    """The COCO folder uploaded to the local S3 server, and Parquet files written from it: read in place through
    workers, the local folder's batches bit for bit (the annotations file and the row groups read by range)."""
    from benchmarks.s3_server import upload_folder
    from lightning_fastdata.detection.convert import write_detection_shards

    options = s3.storage_options()  # type: ignore[attr-defined]
    folder_url = s3.url(f"coco-{tmp_path.name}")  # type: ignore[attr-defined]
    upload_folder(folders["coco"], folder_url, options)
    for split, name in (("train2017", "train"), ("val2017", "val")):
        write_detection_shards(folders["coco"], split, tmp_path / "parquet" / name, fmt="parquet", rows_per_group=3)
    parquet_url = s3.url(f"coco-parquet-{tmp_path.name}")  # type: ignore[attr-defined]
    upload_folder(tmp_path / "parquet", parquet_url, options)

    def batches(root: str, **kw: object) -> list[Batch]:
        args: dict = dict(batch_size=4, num_workers=2, seed=5, storage_options=options, index_dir=str(tmp_path / "i"))
        dm = DetectionDataModule(root, **{**args, **kw})
        dm.setup("fit")
        return list(dm.train_dataloader()) + list(dm.val_dataloader())

    local = batches(str(folders["coco"]), storage_options=None)
    for got in (batches(folder_url), batches(parquet_url, layout="parquet", shuffle_buffer=None,
                                             class_names=list(DETECTION_CLASSES))):  # fmt: skip
        for a, b in zip(local, got, strict=True):
            assert torch.equal(a.images, b.images)
            assert all(torch.equal(x, y) for x, y in zip(a.labels, b.labels, strict=True))


@pytest.mark.timeout(240)
def test_tar_shards_in_a_bucket_are_read_in_runs_and_boxes_follow_their_images(
    folders: dict[str, Path], tmp_path: Path, s3: object
) -> None:
    """COCO tar shards on the local S3 server with ``shuffle_buffer``: read in runs of members (one request a run, the
    next batches' runs requested ahead), shuffled in windows of them; every image once an epoch, its boxes framing
    its own pixels, through 2 workers; a loader restored mid-epoch gives the rest."""
    from benchmarks.s3_server import upload_folder
    from lightning_fastdata.detection.convert import write_detection_shards

    for split, name in (("train2017", "train"), ("val2017", "val")):
        write_detection_shards(folders["coco"], split, tmp_path / "shards" / name, shard_bytes=40_000, fmt="tar")
    url = s3.url(f"coco-tar-{tmp_path.name}")  # type: ignore[attr-defined]
    upload_folder(tmp_path / "shards", url, s3.storage_options())  # type: ignore[attr-defined]

    def make() -> DetectionDataModule:
        return DetectionDataModule(url, layout="shards", batch_size=4, num_workers=2, seed=5, shuffle_buffer=6,
                                   index_dir=str(tmp_path / "idx"), storage_options=s3.storage_options())  # type: ignore[attr-defined]  # fmt: skip

    dm = make()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert dm.train_dataset.block_reads and loader.sampler.windows is not None  # type: ignore[union-attr]
    assert loader.dataset.lookahead is not None  # the next batches' runs requested while one decodes
    drawn = sorted(k[1] for k in loader.sampler)
    assert drawn == sorted(set(drawn)) and len(drawn) == len(dm.train_dataset)  # type: ignore[arg-type]
    identity = {k: k for k in range(len(DETECTION_CLASSES))}
    batches = list(loader)
    assert sum(check_boxes_frame_their_pixels_of(b, identity) for b in batches) > 10
    rest, restored = rest_and_restored(loader, make)
    for a, b in zip(rest, restored, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels.boxes, b.labels.boxes)
