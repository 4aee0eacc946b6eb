"""``ObjectDetector``: the data's labels reach torchvision's models shifted past the background and come back; COCO
mAP over an epoch, with crowds counted as COCO counts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lightning_fastdata import ObjectDetector

TARGETS = [
    {"boxes": torch.tensor([[10.0, 10.0, 50.0, 40.0], [60.0, 20.0, 90.0, 70.0]]), "labels": torch.tensor([0, 2]),
     "iscrowd": torch.tensor([0, 0], dtype=torch.uint8)},
    {"boxes": torch.tensor([[5.0, 5.0, 30.0, 30.0], [40.0, 40.0, 80.0, 90.0]]), "labels": torch.tensor([1, 1]),
     "iscrowd": torch.tensor([0, 1], dtype=torch.uint8)},
]  # fmt: skip


class Oracle(nn.Module):
    """Behaves as torchvision's detection models: training gives losses (and keeps the labels it was given);
    evaluation returns ``answers`` (labels in the model's space: 0 the background)."""

    def __init__(self, answers: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))
        self.answers = answers
        self.seen: list[Any] = []

    def forward(self, images: list[torch.Tensor], targets: Any = None) -> Any:
        if self.training:
            self.seen = [t["labels"].clone() for t in targets]
            return {"classification": self.weight * 2.0, "bbox_regression": self.weight * 0.5}
        return [{**a, "scores": torch.ones(len(a["labels"]))} for a in self.answers]


def val_map(answers: list[dict[str, torch.Tensor]]) -> float:
    det = ObjectDetector(num_classes=3, model=Oracle(answers))
    det.eval()
    det._evaluate(([torch.zeros(3, 100, 100)] * 2, TARGETS), "val")
    return float(det.evaluation_scores("val")["map"])


def test_labels_cross_the_background_both_ways_and_a_perfect_detector_scores_one() -> None:
    det = ObjectDetector(num_classes=3, model=Oracle([]), class_names=["a", "b", "c"])
    loss = det.training_step(([torch.zeros(3, 100, 100)] * 2, TARGETS), 0)
    assert float(loss) == 2.5 and [t.tolist() for t in det.model.seen] == [[1, 3], [2, 2]]  # 0 is the background
    right = [{"boxes": t["boxes"][t["iscrowd"] == 0], "labels": t["labels"][t["iscrowd"] == 0] + 1} for t in TARGETS]
    assert val_map(right) == pytest.approx(1.0)  # the crowd box is neither missed nor a false positive's match
    unshifted = [{"boxes": t["boxes"], "labels": t["labels"] - 1} for t in right]
    assert val_map(unshifted) < 0.5  # labels read back without the shift: wrong classes
    with pytest.raises(ValueError, match="not a torchvision detection model"):
        ObjectDetector(num_classes=3, arch="resnet50")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_map_on_two_ranks_equals_one_rank_and_counts_every_image_once(tmp_path: Path) -> None:
    """13 validation scenes, 2 CPU ranks (gloo), batch 2 (neither divides them): the colour oracle's COCO mAP
    (neither 0 nor 1: merged boxes of a class seen twice) is one rank's exactly, each image on one rank. Before it, a
    training epoch on 2 ranks with aspect-ratio grouping: the same step count on both, every image drawn, batches of
    one orientation."""
    import json

    from helpers.fork_client import SERVER, rank_procs

    from lightning_fastdata.detection.demos import make_detection_folder

    root = make_detection_folder(tmp_path / "coco", count=26, layout="coco", seed=4, val_fraction=0.5, portrait=0.5)
    script = Path(__file__).parents[1] / "helpers" / "ddp_detect.py"
    for devices in ("1", "2"):  # processes forked with the imports done; two ranks told theirs as torchrun does
        procs = rank_procs(2) if devices == "2" else None
        code, out = SERVER.command([str(script), str(tmp_path), devices, str(root)], tmp_path,
                                   tmp_path / f"detect-{devices}.log", procs=procs)  # fmt: skip
        assert code == 0, out[-4000:]
    one = json.loads((tmp_path / "detect-1-rank0.json").read_text())
    two = [json.loads((tmp_path / f"detect-2-rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(two[0]["served"]["validate"] + two[1]["served"]["validate"]) == list(range(13))
    assert 0.1 < one["validate"]["val_map"] < 0.9
    for r in two:
        assert r["validate"] == one["validate"] and r["test"] == one["test"]
    # the training epoch before, portrait and landscape grouped (aspect_ratio_group_factor=0): 13 images on 2 ranks
    steps = [r["trained"] for r in two]
    assert len(steps[0]) == len(steps[1]) == 4  # 7 each (one padded), in batches of 2: the same steps on both
    drawn = [i for rank in steps for step in rank for i in step["indices"]]
    assert set(drawn) == set(range(13)) and len(drawn) == 14
    for rank in steps:  # each batch one orientation, but the unfilled ones closing the share (one per group)
        assert [len(set(step["landscape"])) for step in rank].count(2) <= 1
    assert [len(s["indices"]) for s in one["trained"]] == [2] * 6 + [1]


@pytest.mark.timeout(180)
def test_predictions_are_written_in_cocos_ids_and_pixels_and_score_as_validation_does(tmp_path: Path) -> None:
    """``trainer.predict`` on COCO's validation images with ``BoxWriter``: each image once (two workers, batches of
    three of five), its COCO id, the sparse category ids, the image's pixels: pycocotools' evaluation of the results
    file against the annotation file is exactly the ``val_map`` the module logs for the same detector and images;
    the CSV holds the same boxes with class names."""
    import csv
    import json

    from helpers.colour_oracle import ColourOracle
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from lightning_fastdata import BoxWriter, DetectionDataModule
    from lightning_fastdata.detection.demos import make_detection_folder
    from lightning_fastdata.testing import cpu_trainer

    root = make_detection_folder(tmp_path / "coco", count=20, layout="coco", seed=4)
    dm = DetectionDataModule(str(root), predict_root=str(root / "val2017"), batch_size=3, num_workers=2)
    model = ObjectDetector(num_classes=5, model=ColourOracle())
    writer = BoxWriter(str(tmp_path / "out"), min_score=0.0)
    cpu_trainer(writer).predict(model, datamodule=dm, return_predictions=False)
    logged = cpu_trainer().validate(model, datamodule=DetectionDataModule(str(root), batch_size=3, num_workers=0),
                                    verbose=False)[0]["val_map"]  # fmt: skip

    results = json.loads((tmp_path / "out" / "detections.json").read_text())
    truth = COCO(str(root / "annotations" / "instances_val2017.json"))
    assert {r["image_id"] for r in results} == set(truth.getImgIds()) and len(truth.getImgIds()) == 5
    assert {r["category_id"] for r in results} <= set(truth.getCatIds()) and max(truth.getCatIds()) > 5  # sparse
    evaluation = COCOeval(truth, truth.loadRes(str(tmp_path / "out" / "detections.json")), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    assert 0.1 < evaluation.stats[0] < 1 and evaluation.stats[0] == pytest.approx(logged, abs=1e-6)

    with open(tmp_path / "out" / "detections.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(results) and {r["label"] for r in rows} <= set(dm.classes)
    by_name = {im["file_name"]: im["id"] for im in truth.loadImgs(truth.getImgIds())}
    for row, result in zip(rows, results, strict=True):
        assert by_name[Path(row["path"]).name] == result["image_id"]
        x1, y1, x2, y2 = (float(row[k]) for k in ("xmin", "ymin", "xmax", "ymax"))
        assert result["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1], abs=0.02)
