"""Run 2-process CPU DDP fits (gloo), one per DataModule kind.

Writes what each rank's loader served to OUT/rank<k>-<kind>.json.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_fastdata import (
    EpochSampler,
    HDF5DataModule,
    ImageClassifier,
    ImageFolderDataModule,
    TensorCacheDataModule,
)
from lightning_fastdata.testing import cpu_trainer


class Served(pl.Callback):
    def __init__(self) -> None:
        self.labels: list[int] = []
        self.indices: list[int] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        sampler = trainer.train_dataloader.sampler
        assert type(sampler) is EpochSampler, type(sampler)  # Lightning kept ours
        self.indices = sampler.indices().tolist()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        self.labels += batch[1].tolist()


if __name__ == "__main__":
    # one launch, one fit per KIND=SOURCE: the later Trainers reuse the two processes and their process group
    out, workers = Path(sys.argv[1]), int(sys.argv[2])
    # a rank that hangs prints where every thread is, before the test's timeout kills it (seen once in ~35 runs: a
    # rank stuck in the tensor-cache build after two fits; not reproduced since)
    faulthandler.dump_traceback_later(200, exit=True)
    for pair in sys.argv[3:]:
        kind, source = pair.split("=", 1)
        kw = dict(image_size=16, batch_size=4, num_workers=workers, val_fraction=0)
        if kind == "cache":
            dm = TensorCacheDataModule(source, str(out / "cache"), cache_size=24, build_processes=1, **kw)
        else:
            dm = {"folder": ImageFolderDataModule, "hdf5": HDF5DataModule}[kind](source, **kw)
        served = Served()
        trainer = cpu_trainer(served, strategy="ddp", devices=2)
        trainer.fit(ImageClassifier(num_classes=dm.num_classes), dm)
        record = {"indices": served.indices, "labels": served.labels, "world": trainer.world_size}
        (out / f"rank{trainer.global_rank}-{kind}.json").write_text(json.dumps(record))
