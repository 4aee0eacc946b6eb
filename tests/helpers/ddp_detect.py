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

import lightning.pytorch as pl
from colour_oracle import ColourOracle
from ddp_eval import Served

from lightning_fastdata import DetectionDataModule, ObjectDetector
from lightning_fastdata.testing import cpu_trainer


class Trained(pl.Callback):
    """Each training step of this rank: its samples' indices and whether each image is landscape."""

    def __init__(self) -> None:
        self.steps: list[dict[str, list[int]]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        images, _ = batch
        indices = trainer.train_dataloader.sampler.indices()[2 * idx : 2 * idx + len(images)]  # batch_size 2
        self.steps.append({"indices": [int(i) for i in indices],
                           "landscape": [int(im.shape[-1] > im.shape[-2]) for im in images]})  # fmt: skip


if __name__ == "__main__":
    faulthandler.dump_traceback_later(270, exit=True)  # a rank that hangs says where, before the test's timeout
    out, devices, root = sys.argv[1:4]
    dm = DetectionDataModule(root, test_split="val2017", batch_size=2, num_workers=2, seed=0)
    model = ObjectDetector(num_classes=5, model=ColourOracle())
    # a training epoch first, batches of alike aspect ratios on every rank: each rank's images, its step count
    fitting = DetectionDataModule(root, train_split="train2017", val_split=None, batch_size=2, num_workers=2,
                                  seed=0, aspect_ratio_group_factor=0, keep_empty=True)  # fmt: skip
    trained = Trained()
    fit = cpu_trainer(trained, strategy="ddp" if int(devices) > 1 else "auto", devices=int(devices))
    fit.fit(ObjectDetector(num_classes=5, model=ColourOracle()), datamodule=fitting)
    served = Served()
    strategy = "ddp" if int(devices) > 1 else "auto"
    trainer = cpu_trainer(served, strategy=strategy, devices=int(devices))
    results: dict[str, Any] = {"validate": trainer.validate(model, datamodule=dm, verbose=False)[0]}
    results["test"] = trainer.test(model, datamodule=dm, verbose=False)[0]
    results["served"] = served.served
    results["trained"] = trained.steps
    Path(out, f"detect-{devices}-rank{trainer.global_rank}.json").write_text(json.dumps(results))
