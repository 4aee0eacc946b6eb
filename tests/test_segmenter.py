"""ImageSegmenter and MaskWriter (issue 63): metrics from one confusion matrix, checked against a count done by hand;
a per-pixel model trained on scenes whose classes are their colours predicts masks that, written back at each
image's own size, are that image's classes; 2 ranks give 1 rank's metrics and masks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.fork_client import SERVER, rank_procs
from PIL import Image

from lightning_fastdata import ImageSegmenter, MaskWriter, SegmentationDataModule
from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES, classes_of_colours, make_segmentation_folder
from lightning_fastdata.segmentation.target import IGNORE_INDEX
from lightning_fastdata.segmenter import confusion_matrix, segmentation_scores
from lightning_fastdata.testing import cpu_trainer

N = len(SEGMENTATION_CLASSES)


def test_pixel_accuracy_and_mean_iou_are_those_counted_by_hand() -> None:
    rng = np.random.default_rng(0)
    target = rng.integers(0, 4, size=(3, 17, 13))
    target[rng.random(target.shape) < 0.2] = IGNORE_INDEX
    predicted = np.where(rng.random(target.shape) < 0.6, target % 4, rng.integers(0, 4, size=target.shape))
    predicted[target == 2] = 1  # class 2 never predicted; class 3 absent from the masks and predicted nowhere
    target[target == 3] = 0
    predicted[predicted == 3] = 0
    matrix = confusion_matrix(torch.from_numpy(predicted), torch.from_numpy(target), 5, IGNORE_INDEX)
    scores = segmentation_scores(matrix)
    keep = target != IGNORE_INDEX
    assert int(matrix.sum()) == int(keep.sum())
    assert abs(float(scores["pixel_acc"]) - (predicted[keep] == target[keep]).mean()) < 1e-12
    ious = []
    for c in range(5):
        inter = ((predicted == c) & (target == c) & keep).sum()
        union = (((predicted == c) | (target == c)) & keep).sum()
        if union:
            ious.append(inter / union)
        else:
            assert np.isnan(float(scores["iou"][c]))  # neither in the masks nor predicted: left out of the mean
    assert float(scores["iou"][2]) == 0.0 and abs(float(scores["miou"]) - np.mean(ious)) < 1e-12
    with pytest.raises(ValueError, match="holds the value 7, not a class of 5"):
        confusion_matrix(torch.zeros(2, 2), torch.full((2, 2), 7), 5, IGNORE_INDEX)
    with pytest.raises(ValueError, match="not a torchvision segmentation model"):
        ImageSegmenter(3, arch="resnet18")


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_fit_test_and_predict_write_masks_that_are_each_images_classes(tmp_path: Path) -> None:
    """A per-pixel network learns colour -> class; ``trainer.predict`` with ``MaskWriter`` writes one palette PNG per
    input at the image's own size (portrait and landscape, none a multiple of the base size), named after it, whose
    values are the image's classes: a prediction cut or resized back wrongly would not be."""
    root = make_segmentation_folder(tmp_path / "voc", count=16, size=(150, 110), seed=8)
    dm = SegmentationDataModule(str(root), num_classes=N, class_names=list(SEGMENTATION_CLASSES), base_size=64,
                                crop_size=48, batch_size=4, num_workers=2, test_split="val",
                                predict_root=str(root / "JPEGImages"))  # fmt: skip
    torch.manual_seed(0)
    per_pixel = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, N, 1))
    model = ImageSegmenter(N, model=per_pixel, lr=0.05, class_names=dm.classes, log_class_iou=True)
    trainer = cpu_trainer(MaskWriter(str(tmp_path / "masks")), epochs=15)
    trainer.fit(model, datamodule=dm)
    metrics = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert metrics["test_pixel_acc"] > 0.97 and metrics["test_miou"] > 0.8, metrics
    per_class = {k.removeprefix("test_iou_") for k in metrics if k.startswith("test_iou_")}
    assert "background" in per_class and len(per_class) >= 4 and per_class <= set(SEGMENTATION_CLASSES)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    with open(tmp_path / "masks" / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    images = sorted((root / "JPEGImages").iterdir())
    assert rows[0] == ["path", "mask"] and [r[0] for r in rows[1:]] == [str(p) for p in images]
    agree = total = 0
    for (_, name), image_path in zip(rows[1:], images):
        assert name == image_path.stem + ".png"
        with Image.open(tmp_path / "masks" / name) as mask_file, Image.open(image_path) as image:
            assert mask_file.mode == "P" and mask_file.size == image.size
            mask, truth = np.asarray(mask_file), classes_of_colours(np.asarray(image.convert("RGB")))
        with Image.open(root / "SegmentationClass" / name) as label:
            interior = np.asarray(label) != IGNORE_INDEX
        agree += int((mask[interior] == truth[interior]).sum())
        total += int(interior.sum())
    assert agree / total > 0.95


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_ranks_validate_test_and_predict_as_one(tmp_path: Path) -> None:
    """13 validation scenes, 2 ranks, batch 3: the same loss, pixel accuracy and mIoU (sums over ranks, each image
    on one rank), and the same mask files and table."""
    root = make_segmentation_folder(tmp_path / "voc", count=20, size=(90, 70), seed=9, val_fraction=0.65)
    script = Path(__file__).parent / "helpers" / "ddp_segment.py"
    code, log = SERVER.command([str(script), str(tmp_path), "1", str(root)], tmp_path, tmp_path / "one.log")
    assert code == 0, log[-4000:]
    # two ranks forked from the same server, told theirs as torchrun tells a script's (Lightning launches none)
    code, log = SERVER.command([str(script), str(tmp_path), "2", str(root)], tmp_path, tmp_path / "two.log",
                               procs=rank_procs(2))  # fmt: skip
    assert code == 0, log[-4000:]
    one = json.loads((tmp_path / "seg-1-rank0.json").read_text())
    assert {"val_loss", "val_pixel_acc", "val_miou"} <= one["validate"].keys()
    for rank in (0, 1):
        two = json.loads((tmp_path / f"seg-2-rank{rank}.json").read_text())
        for stage in ("validate", "test"):
            for name, value in one[stage].items():
                assert abs(two[stage][name] - value) < 1e-6, (rank, stage, name)
    tables = [(tmp_path / f"masks-{d}" / "predictions.csv").read_text() for d in (1, 2)]
    assert tables[0] == tables[1] and tables[0].count("\n") == 21
    for name in sorted(p.name for p in (tmp_path / "masks-1").glob("*.png")):
        assert (tmp_path / "masks-1" / name).read_bytes() == (tmp_path / "masks-2" / name).read_bytes()


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_torchvision_segmentation_model_with_its_auxiliary_head_trains_from_the_module(tmp_path: Path) -> None:
    from lightning_fastdata import PredictionWriter

    root = make_segmentation_folder(tmp_path / "voc", count=6, size=(80, 64), seed=10)
    dm = SegmentationDataModule(str(root), num_classes=N, base_size=40, crop_size=32, batch_size=2, num_workers=0,
                                predict_root=str(root / "JPEGImages"))  # fmt: skip
    model = ImageSegmenter(N, arch="deeplabv3_mobilenet_v3_large", aux_loss=True)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, N, 32, 32)
    trainer = cpu_trainer(limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 2 and np.isfinite(float(trainer.callback_metrics["train_loss"]))
    assert {"val_loss", "val_pixel_acc", "val_miou"} <= trainer.callback_metrics.keys()
    with pytest.raises(ValueError, match="returns masks, not class scores: use MaskWriter"):
        cpu_trainer(PredictionWriter(str(tmp_path / "p.csv"))).predict(model, datamodule=dm)


def test_an_evaluation_whose_pixels_are_all_ignored_says_so(tmp_path: Path) -> None:
    """Masks that are all the ignore index (a wrong label_map or num_classes): validate logged nothing at all, so a
    monitor of val_miou failed later on a missing name, or nothing was said. Now a warning names the cause and the
    metrics are logged as NaN."""
    root = make_segmentation_folder(tmp_path / "voc", count=6, size=(60, 40), seed=2)
    everything_ignored = {k: IGNORE_INDEX for k in range(256)}
    dm = SegmentationDataModule(str(root), num_classes=N, base_size=32, crop_size=24, batch_size=2, num_workers=0,
                                label_map=everything_ignored)  # fmt: skip
    model = ImageSegmenter(N, model=torch.nn.Conv2d(3, N, 1))
    with pytest.warns(UserWarning, match=r"Every pixel of the val masks is the ignore index \(255\)"):
        metrics = cpu_trainer().validate(model, datamodule=dm, verbose=False)[0]
    assert set(metrics) == {"val_loss", "val_pixel_acc", "val_miou"} and all(np.isnan(v) for v in metrics.values())
