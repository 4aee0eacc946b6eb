"""``trainer.validate`` and ``test`` of an ``ObjectDetector`` on DEVICES CPU processes (gloo), a COCO folder.

The detector is a colour oracle (the demo scenes' rectangles are their class's colour): for each class, one box
around all its pixels, scored by their share of it. Scenes with two rectangles of a class get one merged box, so
the mAP is neither 0 nor 1: a count of an image twice, or of none, moves it. Writes OUT/detect-<devices>-rank<k>.json:
the metrics and the validation images each rank served. argv: OUT DEVICES ROOT.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ddp_eval import Served
from torch import nn

from lightning_fastdata import DetectionDataModule, ObjectDetector
from lightning_fastdata.augment.normalize import IMAGENET_MEAN, IMAGENET_STD
from lightning_fastdata.segmentation.demos import classes_of_colours
from lightning_fastdata.testing import cpu_trainer


class ColourOracle(nn.Module):
    """Detects each class's colour (module docstring); labels 1 .. 5 as torchvision's models give them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, images: list[torch.Tensor], targets: Any = None) -> Any:
        mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
        out = []
        for image in images:
            pixels = ((image.float().cpu() * std + mean) * 255).round().clamp(0, 255).to(torch.uint8).numpy()
            classes = classes_of_colours(pixels)
            boxes, labels, scores = [], [], []
            for k in range(1, 6):
                ys, xs = np.nonzero(classes == k)
                if len(ys) < 20:
                    continue
                box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
                boxes.append(box)
                labels.append(k)
                scores.append(len(ys) / ((box[2] - box[0]) * (box[3] - box[1])))
            out.append({"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                        "labels": torch.tensor(labels, dtype=torch.int64),
                        "scores": torch.tensor(scores, dtype=torch.float32)})  # fmt: skip
        return out


if __name__ == "__main__":
    faulthandler.dump_traceback_later(270, exit=True)  # a rank that hangs says where, before the test's timeout
    out, devices, root = sys.argv[1:4]
    dm = DetectionDataModule(root, test_split="val2017", batch_size=2, num_workers=2, seed=0)
    model = ObjectDetector(num_classes=5, model=ColourOracle())
    served = Served()
    strategy = "ddp" if int(devices) > 1 else "auto"
    trainer = cpu_trainer(served, strategy=strategy, devices=int(devices))
    results: dict[str, Any] = {"validate": trainer.validate(model, datamodule=dm, verbose=False)[0]}
    results["test"] = trainer.test(model, datamodule=dm, verbose=False)[0]
    results["served"] = served.served
    Path(out, f"detect-{devices}-rank{trainer.global_rank}.json").write_text(json.dumps(results))
