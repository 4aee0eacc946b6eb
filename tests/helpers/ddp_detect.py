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

from colour_oracle import ColourOracle
from ddp_eval import Served

from lightning_fastdata import DetectionDataModule, ObjectDetector
from lightning_fastdata.testing import cpu_trainer

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
