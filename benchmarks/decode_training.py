"""Does the default decode change what a model learns? Issue 26's training-relevant difference, measured.

The default path decodes a crop at least twice the output in the DCT domain (1/2, 1/4, 1/8) and uses the fast
integer IDCT; ``exact_decode=True`` decodes every crop at full size with the exact IDCT. Both feed the same model
from the same seeds (same crop boxes, same order), so the runs differ by the decoded pixels only. The task is
chosen to be sensitive to them: 8 classes of photo-like images whose dominant hues are only 0.04 apart (the
demo data's classes are 0.125 apart and saturate at 100%), at 112 px output from ~400x300 images, where about
half the training crops are DCT-scaled. Validation accuracy after a few epochs, per seed and mode, on held-out
images (their central crops, decoded by the same mode: at 1/2 scale by default, being twice the output).

    python -m benchmarks.decode_training --json benchmarks/results/decode-training.json

A difference within the spread between seeds is no difference this test can see.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import record

CLASSES, HUE0, HUE_STEP = 8, 0.45, 0.04


def _make(root: Path, per_class: int, seed: int) -> None:
    from lightning_fastdata.demos import photo_like_image

    for label in range(CLASSES):
        rng = np.random.default_rng([seed, label])
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = int(400 * rng.uniform(0.85, 1.0)), int(300 * rng.uniform(0.85, 1.0))
            buf = io.BytesIO()
            photo_like_image(rng, w, h, HUE0 + HUE_STEP * label).save(buf, "JPEG", quality=90)
            (folder / f"{i:04d}.jpg").write_bytes(buf.getvalue())


def _train(root: Path, val: Path, exact: bool, seed: int, epochs: int) -> dict[str, float]:
    import lightning.pytorch as pl

    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.models import ImageClassifier
    from lightning_fastdata.testing import cpu_trainer

    pl.seed_everything(seed, verbose=False)
    dm = ImageFolderDataModule(
        str(root),
        str(val),
        image_size=112,
        batch_size=32,
        num_workers=2,
        seed=seed,
        exact_decode=exact,
        entropy_index=False,
    )
    model = ImageClassifier(CLASSES, arch="resnet18", lr=2e-3)
    trainer = cpu_trainer(epochs=epochs, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(model, dm)
    return {
        "val_acc": float(trainer.callback_metrics["val_acc"]),
        "val_loss": float(trainer.callback_metrics["val_loss"]),
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-class", type=int, default=120, help="training images per class (validation: a third)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastdata-decode-training-") as tmp:
        train, val = Path(tmp) / "train", Path(tmp) / "val"
        _make(train, args.per_class, 0)
        _make(val, max(8, args.per_class // 3), 1)
        for seed in args.seeds:
            for exact in (False, True) if seed % 2 == 0 else (True, False):  # alternate which runs first
                got = _train(train, val, exact, seed, args.epochs)
                rows.append({"seed": seed, "exact_decode": exact, **got})
                print(rows[-1], flush=True)
    summary = {}
    for exact in (False, True):
        accs = [r["val_acc"] for r in rows if r["exact_decode"] == exact]
        summary["exact_decode=True" if exact else "default"] = {
            "val_acc_mean": statistics.mean(accs),
            "val_acc_per_seed": accs,
        }
    diffs = [
        next(r["val_acc"] for r in rows if r["seed"] == s and not r["exact_decode"])
        - next(r["val_acc"] for r in rows if r["seed"] == s and r["exact_decode"])
        for s in args.seeds
    ]
    summary["default minus exact, per seed"] = diffs
    print(json.dumps(summary, indent=1))
    setup = {"classes": CLASSES, "hue_step": HUE_STEP, "per_class": args.per_class, "epochs": args.epochs}
    return record(args.json, what=__doc__.split("\n")[0], setup=setup, summary=summary, runs=rows)


if __name__ == "__main__":
    main()
