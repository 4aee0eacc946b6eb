"""One training run for the resume conformance tests; records what every step trained on.

Usage: python resume_run.py '<json config>'. Config keys: kind (folder|hdf5|cache|shards|segmentation), source, workers,
max_steps, ckpt_dir, save_every (checkpoint interval, or null), ckpt_path (resume from it, or null), record (JSON-lines
file, one line per step, appended and flushed at once), devices (1 or 2: DDP on CPU), kill_at (SIGKILL this process at
the start of that step, or null), raise_at (raise an error in that step, as an out-of-memory error would, with an
OnExceptionCheckpoint saving ckpt_dir/on_exception.ckpt), stepping (touch trainer.estimated_stepping_batches in
configure_optimizers, Lightning #20550; it only loads data early with max_epochs set), max_epochs, cache_dir,
accelerator ("cpu" unless given), storage_options (for an s3:// source), prefetch (add FastDataCallback: pinned memory
and the side-stream prefetch), batch_size (8 unless given), block_shuffle, recipe (train with a training recipe:
TrivialAugmentWide in the workers and on the device, RandomErasing, MixUp or CutMix, repeated augmentation), labels (a
label table for a flat folder source; folder and cache kinds), multi_label, mix_with (kind "mixed": an HDF5 file drawn
twice as often as the folder source, in a MixedDataModule of 30 samples an epoch), sampling (the DataModule's sampling
arguments: sample_weights, replacement, epoch_size, classes, max_per_class, fraction). Kind captions: an
ImageTextDataModule on img2dataset-style tar shards; its "labels" recorded are the captions.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from torch import nn
from torchvision.transforms import v2

from lightning_fastdata import (
    FastDataCallback,
    HDF5DataModule,
    ImageFolderDataModule,
    ImageTextDataModule,
    MixedDataModule,
    SegmentationDataModule,
    ShardDataModule,
    TensorCacheDataModule,
)
from lightning_fastdata.augment import RandomErasing, TrivialAugmentWide


class Recorder(pl.LightningModule):
    def __init__(self, record: str, kill_at: int | None, stepping: bool, raise_at: int | None = None) -> None:
        super().__init__()
        self.record, self.kill_at, self.stepping, self.raise_at = record, kill_at, stepping, raise_at
        self.net = nn.Linear(3, 3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch[0], batch[1]
        if self.kill_at is not None and self.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # not an exception: the process just dies
        if self.raise_at is not None and self.global_step == self.raise_at:
            raise RuntimeError("simulated out of memory")  # this step's batch was never trained
        sums = images.double().flatten(1).sum(1).round(decimals=3).tolist()  # captions: normalised floats
        line = {"step": self.global_step, "epoch": self.current_epoch, "rank": self.global_rank}
        if isinstance(labels, list):  # captions: the strings themselves
            pass
        elif labels.dim() == 3:  # segmentation masks: a checksum of each, weighted by position (a moved mask differs)
            weights = torch.arange(1, labels[0].numel() + 1, dtype=torch.float64)
            labels = (labels.flatten(1).double() * weights).sum(1).long()
        line.update(labels=labels if isinstance(labels, list) else labels.tolist(), sums=sums)
        with open(f"{self.record}.rank{self.global_rank}", "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
        return self.net(images.mean(dim=(2, 3))).sum() * 0.0 + self.net.weight.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.stepping:
            assert self.trainer.estimated_stepping_batches > 0  # Lightning #20550: loads the data early
            print(
                "STEPPING",
                self.trainer.train_dataloader is not None,
                self.trainer.fit_loop._combined_loader_states_to_load,
            )
        return torch.optim.SGD(self.parameters(), lr=0.0)


def without(kw: dict[str, Any], *names: str) -> dict[str, Any]:
    """``kw`` less ``names`` (a segmentation module's batch size is its crop, its splits named)."""
    return {k: v for k, v in kw.items() if k not in names}


def main(cfg: dict[str, Any]) -> None:
    kw = dict(image_size=16, batch_size=cfg.get("batch_size", 8), num_workers=cfg["workers"], val_fraction=0.0, seed=0)
    if cfg.get("block_shuffle"):
        kw["block_shuffle"] = cfg["block_shuffle"]
    if "snapshot" in cfg:
        kw["snapshot_every_n_steps"] = cfg["snapshot"]
    if cfg.get("storage_options"):
        kw["storage_options"] = cfg["storage_options"]
    kw.update(cfg.get("sampling") or {})
    if cfg.get("labels"):
        kw.update(labels=cfg["labels"], multi_label=cfg.get("multi_label", False))
    if cfg.get("recipe"):
        kw.update(
            train_transforms=v2.TrivialAugmentWide(),
            device_transforms=TrivialAugmentWide(),
            batch_transforms=[
                RandomErasing(0.5),
                v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)]),
            ],
            repeated_augmentations=2,
        )
    if cfg["kind"] == "mixed":
        sources = [
            ImageFolderDataModule(cfg["source"], image_size=16, val_fraction=0.0),
            HDF5DataModule(cfg["mix_with"], image_size=16, val_fraction=0.0),
        ]
        dm: pl.LightningDataModule = MixedDataModule(sources, weights=[1.0, 2.0], epoch_size=30, **kw)
    elif cfg["kind"] == "folder":
        dm = ImageFolderDataModule(cfg["source"], **kw)
    elif cfg["kind"] == "hdf5":
        dm = HDF5DataModule(cfg["source"], **kw)
    elif cfg["kind"] == "segmentation_mixed":  # a VOC folder and an HDF5 file, drawn 1:2
        names = ["background", "red", "green", "blue", "yellow", "magenta"]
        seg = dict(num_classes=6, class_names=names, base_size=24, crop_size=16, val_split=None)
        parts = [SegmentationDataModule(cfg["source"], **seg), SegmentationDataModule(cfg["mix_with"], **seg)]
        dm = MixedDataModule(parts, weights=[1.0, 2.0], epoch_size=30, **kw)
    elif cfg["kind"] in ("segmentation", "segmentation_cache"):
        names = ["background", "red", "green", "blue", "yellow", "magenta"]
        cache = cfg["cache_dir"] if cfg["kind"] == "segmentation_cache" else None
        policy = TrivialAugmentWide() if cfg.get("seg_policy") else None  # warps move the masks too
        dm = SegmentationDataModule(
            cfg["source"], num_classes=6, class_names=names, base_size=24, crop_size=16, val_split=None,
            cache_dir=cache, device_transforms=policy, **without(kw, "image_size", "val_fraction"),
        )  # fmt: skip
    elif cfg["kind"] == "captions":
        dm = ImageTextDataModule(cfg["source"], index_dir=cfg["cache_dir"], **without(kw, "val_fraction"))
    elif cfg["kind"] == "shards":
        dm = ShardDataModule(cfg["source"], index_dir=cfg["cache_dir"], shuffle_buffer=cfg.get("shuffle_buffer"), **kw)
    else:
        dm = TensorCacheDataModule(cfg["source"], cfg["cache_dir"], cache_size=20, build_processes=1, **kw)
    callbacks: list[pl.Callback] = []
    if cfg.get("raise_at") is not None:
        callbacks.append(OnExceptionCheckpoint(dirpath=cfg["ckpt_dir"], filename="on_exception"))
    if cfg.get("save_every"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=cfg["ckpt_dir"], every_n_train_steps=cfg["save_every"], save_top_k=-1, save_last=True
            )
        )
    trainer = pl.Trainer(
        max_steps=cfg["max_steps"],
        max_epochs=cfg.get("max_epochs"),
        accelerator=cfg.get("accelerator", "cpu"),
        devices=cfg.get("devices", 1),
        strategy="ddp" if cfg.get("devices", 1) > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks + ([FastDataCallback(prefetch=True, print_summary=False)] if cfg.get("prefetch") else []),
        num_sanity_val_steps=0,
    )
    model = Recorder(cfg["record"], cfg.get("kill_at"), cfg.get("stepping", False), cfg.get("raise_at"))
    trainer.fit(model, dm, ckpt_path=cfg.get("ckpt_path"))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
