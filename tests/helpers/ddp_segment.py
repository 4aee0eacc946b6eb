"""``trainer.validate``, ``test`` and ``predict`` of ``ImageSegmenter`` on DEVICES CPU processes (gloo).

Writes OUT/seg-<devices>-rank<k>.json (the metrics each call returned) and OUT/masks-<devices>/ (MaskWriter's PNGs and
table). The model is per-pixel (a 1 x 1 convolution): its predictions do not depend on how images are batched.
argv: OUT DEVICES ROOT.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_fastdata import ImageSegmenter, MaskWriter, SegmentationDataModule
from lightning_fastdata.testing import cpu_trainer

if __name__ == "__main__":
    faulthandler.dump_traceback_later(270, exit=True)  # a rank that hangs says where, before the test's timeout
    out, devices, root = sys.argv[1:4]
    dm = SegmentationDataModule(
        root, num_classes=6, base_size=40, crop_size=32, batch_size=3, num_workers=2, val_split="val",
        test_split="val", predict_root=str(Path(root, "JPEGImages")),
    )  # fmt: skip
    pl.seed_everything(0)
    model = ImageSegmenter(num_classes=6, model=torch.nn.Conv2d(3, 6, 1))  # the same weights in every run
    writer = MaskWriter(str(Path(out, f"masks-{devices}")))
    strategy = "ddp" if int(devices) > 1 else "auto"
    trainer: Any = cpu_trainer(writer, strategy=strategy, devices=int(devices))
    results = {
        "validate": trainer.validate(model, datamodule=dm, verbose=False)[0],
        "test": trainer.test(model, datamodule=dm, verbose=False)[0],
    }
    trainer.predict(model, datamodule=dm, return_predictions=False)
    Path(out, f"seg-{devices}-rank{trainer.global_rank}.json").write_text(json.dumps(results))
