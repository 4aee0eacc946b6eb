"""``trainer.validate``, ``test`` and ``predict`` on DEVICES CPU processes (gloo), the folder and the HDF5 modules.

Writes OUT/eval-<devices>-rank<k>.json: the metrics each call returned and the sample indices each rank's
validation and test loaders served; and OUT/pred-<devices>-<kind>.csv, the prediction table of TEST_ROOT's images.
The "table" kind: FLAT_TRAIN and FLAT_TEST labelled by one multi-label TABLE (mAP and F1 over the gathered scores).
argv: OUT DEVICES ROOT TEST_ROOT TEST_H5 TRAIN_H5 FLAT_TRAIN FLAT_TEST TABLE.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_fastdata import HDF5DataModule, ImageClassifier, ImageFolderDataModule, PredictionWriter
from lightning_fastdata.testing import cpu_trainer


class Served(pl.Callback):
    """The indices each evaluation loader of this rank serves (its sampler's share)."""

    def __init__(self) -> None:
        self.served: dict[str, list[int]] = {}

    def _record(self, name: str, loaders: Any) -> None:
        loader = loaders[0] if isinstance(loaders, list) else loaders
        self.served[name] = [int(i) for i in loader.sampler.indices().tolist()]

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record("validate", trainer.val_dataloaders)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record("test", trainer.test_dataloaders)


if __name__ == "__main__":
    faulthandler.dump_traceback_later(270, exit=True)  # a rank that hangs says where, before the test's timeout
    out, devices, root, test_root, test_h5, train_h5, flat_train, flat_test, table = sys.argv[1:10]
    kw: dict[str, Any] = dict(image_size=16, batch_size=4, num_workers=2, val_fraction=0, seed=0)
    results: dict[str, Any] = {}
    trainer: Any = None
    for kind in ("folder", "hdf5", "table"):
        if kind == "folder":
            dm: Any = ImageFolderDataModule(root, val_root=test_root, test_root=test_root, predict_root=test_root, **kw)
        elif kind == "table":
            dm = ImageFolderDataModule(
                flat_train, val_root=flat_test, test_root=flat_test, predict_root=test_root, labels=table,
                multi_label=True, **kw,
            )  # fmt: skip
        else:
            dm = HDF5DataModule(train_h5, val_root=test_h5, test_root=test_h5, predict_root=test_root, **kw)
        pl.seed_everything(0)
        model = ImageClassifier(num_classes=dm.num_classes, multi_label=dm.multi_label)  # the same weights in every run
        served = Served()
        strategy = "ddp" if int(devices) > 1 else "auto"
        writer = PredictionWriter(str(Path(out, f"pred-{devices}-{kind}.csv")), top_k=2)
        trainer = cpu_trainer(served, writer, strategy=strategy, devices=int(devices))
        results[f"{kind} validate"] = trainer.validate(model, datamodule=dm, verbose=False)[0]
        results[f"{kind} test"] = trainer.test(model, datamodule=dm, verbose=False)[0]
        trainer.predict(model, datamodule=dm, return_predictions=False)
        results[f"{kind} served"] = served.served
    Path(out, f"eval-{devices}-rank{trainer.global_rank}.json").write_text(json.dumps(results))
