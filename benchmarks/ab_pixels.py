"""Same pixels? Hashes of every training batch of a dozen set-ups, an older revision against this checkout.

What a refactor of the augmentation or the loading path must show (issue 52: "the same pixels"): each set-up is fit
for a few steps on a generated folder in both trees (the old one in a git worktree with its own build of the JPEG
extension); the model hashes each batch as ``training_step`` gets it, after the transfer and the device transforms
(images and labels, MixUp's soft labels included). Set-ups: crop+flip (0 and 2 workers), the torchvision recipe's
policies on the device, the policy in the workers (torchvision's object), RandAugment + RandomErasing on the device,
repeated augmentation, and the tensor cache with ``augment_on`` device and workers, with and without a policy.

    python -m benchmarks.ab_pixels --old HEAD~1 --json benchmarks/results/ab-pixels.json
    python -m benchmarks.ab_pixels --hashes out.json     # one tree's hashes only (what each side runs)

A set-up whose hashes differ is listed with the first step that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: name -> (DataModule class, its arguments besides root/cache_dir); policies by class path, built in the tree run
SETUPS: dict[str, tuple[str, dict[str, Any]]] = {
    "crop-flip, 0 workers": ("folder", {"num_workers": 0}),
    "crop-flip, 2 workers": ("folder", {"num_workers": 2}),
    "recipe (device policy, erasing, mixup/cutmix, repeats)": ("folder", {"num_workers": 2, "recipe": True}),
    "policy in the workers": ("folder", {"num_workers": 2, "train_transforms": "tv.TrivialAugmentWide"}),
    "randaugment + erasing on the device": (
        "folder",
        {"num_workers": 0, "device_transforms": ["fd.RandAugment"], "batch_transforms": ["fd.RandomErasing"]},
    ),
    "repeated augmentation x3": ("folder", {"num_workers": 2, "repeated_augmentations": 3}),
    "exact decode": ("folder", {"num_workers": 0, "exact_decode": True}),
    "cache, augment on workers": ("cache", {"num_workers": 2, "augment_on": "workers"}),
    "cache, augment on device": ("cache", {"num_workers": 2, "augment_on": "device"}),
    "cache, workers + policy": ("cache", {"num_workers": 2, "train_transforms": "tv.TrivialAugmentWide"}),
    "cache, device + device policy": (
        "cache",
        {"num_workers": 0, "augment_on": "device", "device_transforms": ["fd.TrivialAugmentWide"]},
    ),
    "val batches": ("folder", {"num_workers": 0, "val": True}),
}


def _build(spec: str) -> Any:
    import torchvision.transforms.v2 as tv

    import lightning_fastdata.augment as fd

    space, name = spec.split(".")
    return getattr(tv if space == "tv" else fd, name)()


def _recipe() -> dict[str, Any]:
    import torchvision.transforms.v2 as tv

    import lightning_fastdata.augment as fd

    mix = tv.RandomChoice([tv.MixUp(alpha=0.2, num_classes=4), tv.CutMix(alpha=1.0, num_classes=4)])
    return {
        "device_transforms": [fd.TrivialAugmentWide()],
        "batch_transforms": [fd.RandomErasing(p=0.5), mix],
        "repeated_augmentations": 2,
    }


def hashes(root: Path, scratch: Path, steps: int = 6) -> dict[str, list[str]]:
    """``set-up -> [sha1 of each batch]`` in this process's tree (``PYTHONPATH`` picks which)."""
    import lightning.pytorch as pl
    import torch

    from lightning_fastdata import ImageFolderDataModule, TensorCacheDataModule
    from lightning_fastdata.testing import cpu_trainer

    class Hasher(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[str] = []

        def _hash(self, batch: Any) -> None:
            images, labels = batch[0], batch[1]
            h = hashlib.sha1(images.detach().float().contiguous().cpu().numpy().tobytes())
            h.update(labels.detach().float().contiguous().cpu().numpy().tobytes())
            self.seen.append(h.hexdigest()[:16])

        def training_step(self, batch: Any, idx: int) -> Any:
            self._hash(batch)
            return self.w.sum() * 0

        def validation_step(self, batch: Any, idx: int) -> None:
            self._hash(batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    out: dict[str, list[str]] = {}
    for name, (kind, args) in SETUPS.items():
        args = dict(args)
        val = args.pop("val", False)
        if args.pop("recipe", False):
            args.update(_recipe())
        for key in ("train_transforms",):
            if isinstance(args.get(key), str):
                args[key] = _build(args[key])
        for key in ("device_transforms", "batch_transforms"):
            if key in args:
                args[key] = [_build(s) if isinstance(s, str) else s for s in args[key]]
        common = dict(image_size=64, batch_size=8, seed=3, val_fraction=0.25, **args)
        if kind == "folder":
            dm: Any = ImageFolderDataModule(root=str(root), index_dir=str(scratch / "index"), **common)
        else:
            cache = scratch / "cache"
            dm = TensorCacheDataModule(root=str(root), cache_dir=str(cache), cache_size=80, **common)
        model = Hasher()
        torch.manual_seed(0)
        if val:
            cpu_trainer(epochs=-1, limit_val_batches=steps).validate(model, datamodule=dm, verbose=False)
        else:
            trainer = cpu_trainer(epochs=2, limit_train_batches=steps // 2, limit_val_batches=0)
            trainer.fit(model, datamodule=dm)
        out[name] = model.seen
    return out


def _side(tree: Path, root: Path, scratch: Path, out: Path) -> dict[str, list[str]]:
    # this file run by path, beside the tree's package (an older tree has no ab_pixels of its own)
    script = scratch / "ab_pixels_side.py"
    shutil.copy(__file__, script)
    cmd = [sys.executable, str(script), "--root", str(root), "--scratch", str(scratch)]
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([*cmd, "--hashes", str(out)], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr[-3000:]}")
    result: dict[str, list[str]] = json.loads(out.read_text())
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", help="the revision to compare with (a commit, tag or branch)")
    p.add_argument("--hashes", help="only write this tree's hashes to this file")
    p.add_argument("--root", help="image folder (generated under the scratch folder if not given)")
    p.add_argument("--scratch", help="scratch folder (a temporary one if not given)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ab-pixels-") as tmp:
        scratch = Path(args.scratch or tmp)
        root = Path(args.root) if args.root else scratch / "images"
        if not root.exists():
            from lightning_fastdata.demos import make_image_folder

            make_image_folder(root, num_classes=4, per_class=20, size=(160, 120))
        if args.hashes:
            Path(args.hashes).write_text(json.dumps(hashes(root, scratch)))
            return {}
        if not args.old:
            p.error("--old REV (or --hashes FILE)")
        from benchmarks import old_worktree, record

        with old_worktree(args.old, Path(tmp)) as old:
            sides = {}
            for label, tree in (("old", old), ("new", REPO)):
                side_scratch = Path(tmp) / f"scratch-{label}"
                side_scratch.mkdir()
                sides[label] = _side(tree, root, side_scratch, Path(tmp) / f"{label}.json")
        rows = {}
        for name in SETUPS:
            a, b = sides["old"].get(name, []), sides["new"].get(name, [])
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            equal = a == b and bool(a)
            rows[name] = {"batches": len(b), "equal": equal, **({} if equal else {"first_difference": first})}
            print(f"{'same' if equal else 'DIFFERENT':9} {len(b):3} batches  {name}")
        old_rev = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=REPO, capture_output=True, text=True)
        new_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        return record(
            args.json,
            old=old_rev.stdout.strip(),
            new=new_rev.stdout.strip() + ("+changes" if _dirty() else ""),
            setups=rows,
            equal=all(r["equal"] for r in rows.values()),
        )


def _dirty() -> bool:
    return bool(subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()
