"""The resume snippet (docs/resume.md) as a script a preempted job reruns: snippet_run.py ROOT CKPT_DIR MAX_STEPS.

Appends each step's epoch, step, batch index and labels to $FASTDATA_RECORD (see step_recorder.py). The model is
mobilenet_v3_small, not the page's resnet18: saving resnet18's 45 MB checkpoints was half of the test's time.
"""

from __future__ import annotations

import sys

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from step_recorder import StepRecorder

from lightning_fastdata import FastDataCallback, ImageClassifier, ImageFolderDataModule

if __name__ == "__main__":
    root, ckpt_dir, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dm = ImageFolderDataModule(root, image_size=16, batch_size=4, num_workers=2, val_fraction=0)
    model = ImageClassifier(num_classes=dm.num_classes, arch="mobilenet_v3_small")
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_last=True, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=max_steps, accelerator="cpu", callbacks=[ckpt, FastDataCallback(), StepRecorder()],
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, dm, ckpt_path="last")
