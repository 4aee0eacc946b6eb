from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_fastdata import ImageClassifier, ImageFolderDataset, TensorCacheDataModule, open_tensor_cache
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.batch import DeviceBatch
from lightning_fastdata.loading.jpeg.decode import decode_center_crop
from lightning_fastdata.testing import cpu_trainer


def module(root: Path, cache: Path, **kw: object) -> TensorCacheDataModule:
    args = dict(image_size=24, cache_size=32, batch_size=8, num_workers=0, val_fraction=0.25, build_processes=1)
    args.update(kw)
    return TensorCacheDataModule(str(root), str(cache), **args)  # type: ignore[arg-type]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "src", num_classes=3, per_class=7, size=(64, 48))


def test_cache_equals_the_decode_resize_reference(folder: Path, tmp_path: Path) -> None:
    dm = module(folder, tmp_path / "c")
    dm.prepare_data()
    dm.setup("fit")
    train, val = dm.train_dataset, dm.val_dataset
    cached = np.load(tmp_path / "c" / "train_images.npy")
    index = dm.source.indexes(dm.split)[0]
    assert cached.shape == (16, 32, 32, 3) and len(val) == 5  # type: ignore[arg-type]
    for i in (0, 7, 15):
        assert np.array_equal(cached[i], decode_center_crop(index.path(i), 32))
    # validation = the folder module's Resize + CenterCrop, decoded by the same path
    _, val_index = dm.source.indexes(dm.split)
    reference = ImageFolderDataset(val_index, train=False, image_size=24)  # type: ignore[arg-type]
    x, y = val.__getitems__(list(range(5)))  # type: ignore[union-attr]
    rx, ry = reference.__getitems__(list(range(5)))
    assert torch.equal(x, rx) and torch.equal(y, ry)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["params"]["cache_size"] == 32
    assert manifest["counts"] == {"train": 16, "val": 5} and len(manifest["params"]["fingerprint"]) == 64
    assert train is not None and len(train) == 16  # type: ignore[arg-type]


def test_augmentation_random_across_epochs_and_reproducible(folder: Path, tmp_path: Path) -> None:
    def batch(epoch: int, seed: int) -> torch.Tensor:
        dm = module(folder, tmp_path / "c", seed=seed, val_fraction=0.0)
        dm.setup("fit")
        return dm.train_dataset.__getitems__([(epoch, i) for i in range(16)])[0]  # type: ignore[union-attr]

    a = batch(0, 1)
    assert torch.equal(a, batch(0, 1))
    assert not torch.equal(a, batch(1, 1)) and not torch.equal(a, batch(0, 2))


def test_device_augmentation_matches_worker_augmentation(folder: Path, tmp_path: Path) -> None:
    keys = [(3, i) for i in range(16)]
    on_workers = module(folder, tmp_path / "c", val_fraction=0.0)
    on_device = module(folder, tmp_path / "c", val_fraction=0.0, augment_on="device")
    on_workers.setup("fit")
    on_device.setup("fit")
    ref = on_workers.on_after_batch_transfer(on_workers.train_dataset.__getitems__(keys), 0)[0]  # type: ignore[union-attr]
    raw = on_device.train_dataset.__getitems__(keys)  # type: ignore[union-attr]
    assert isinstance(raw, DeviceBatch) and raw.keys is None  # whole cached squares + boxes + flips, no policy
    assert raw.images.shape == (16, 3, 32, 32) and raw.boxes.shape == (16, 4) and raw.flips.shape == (16,)
    got, labels = on_device.on_after_batch_transfer(raw, 0)
    assert got.shape == ref.shape == (16, 3, 24, 24) and torch.equal(labels, raw.labels)
    # same crops and flips; roi_align vs antialiased resize differ slightly (normalised units, std ~ 1/58)
    assert (got - ref).abs().mean() < 0.06


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_killed_build_never_yields_a_cache_and_the_rerun_resumes(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "src", num_classes=2, per_class=400, size=(160, 120), processes=2)
    cache = tmp_path / "cache"
    code = (
        "from lightning_fastdata import TensorCacheDataModule as T; "
        f"T({str(src)!r}, {str(cache)!r}, image_size=64, cache_size=96, val_fraction=0, build_processes=1)"
        ".prepare_data()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    progress = tmp_path / "cache.partial" / "progress.json"
    deadline = time.time() + 90
    while time.time() < deadline:  # kill once the build has checkpointed some progress, before it ends
        try:
            if json.loads(progress.read_text())["done"]["train"] >= 256:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(FileNotFoundError, match="No complete tensor cache"):
        open_tensor_cache(cache, "train")
    dm = TensorCacheDataModule(str(src), str(cache), image_size=64, cache_size=96, val_fraction=0, build_processes=2)
    out = subprocess.run(
        [sys.executable, "-c", code.replace("build_processes=1", "build_processes=2")], capture_output=True, text=True
    )
    assert "resuming the interrupted cache build" in out.stdout, out.stdout + out.stderr[-2000:]
    path, labels = open_tensor_cache(cache, "train")
    resumed = np.load(path)
    index = dm.source.indexes(dm.split)[0]
    for i in (0, 255, 256, 300, 799):  # before and after the kill
        assert np.array_equal(resumed[i], decode_center_crop(index.path(i), 96))
    assert not (tmp_path / "cache.partial").exists()


def test_changed_source_triggers_the_stale_path(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    module(folder, tmp_path / "c").prepare_data()
    capsys.readouterr()
    module(folder, tmp_path / "c").prepare_data()
    assert "building" not in capsys.readouterr().out  # current: reused
    changed = folder / "class_001" / "img_000003.jpg"
    changed.write_bytes(changed.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="source images changed.*read_only=True"):
        module(folder, tmp_path / "c", read_only=True).prepare_data()
    module(folder, tmp_path / "c").prepare_data()
    assert "the source images changed" in capsys.readouterr().out
    with pytest.raises(ValueError, match="image_size changed"):
        module(folder, tmp_path / "c", image_size=20, read_only=True).prepare_data()


def test_bad_caches_and_directories(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dm = module(folder, tmp_path / "c")
    dm.prepare_data()
    manifest = tmp_path / "c" / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "format_version": 7}))
    with pytest.raises(ValueError, match="format_version=7.*upgrade"):
        open_tensor_cache(tmp_path / "c", "train")
    manifest.write_text(json.dumps(data))
    arr = tmp_path / "c" / "train_images.npy"
    arr.write_bytes(arr.read_bytes()[:5000])
    with pytest.raises(OSError, match="truncated.*delete"):
        open_tensor_cache(tmp_path / "c", "train")
    monkeypatch.setattr("shutil.disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(OSError, match=r"needs 0\.\d+ GB, 0\.00 GB are free"):
        module(folder, tmp_path / "d").prepare_data()
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(PermissionError, match="not writable"):
        module(folder, tmp_path / "e").prepare_data()
    with pytest.raises(ValueError, match="cache_size=16 is smaller than image_size=24"):
        module(folder, tmp_path / "f", cache_size=16)
    other = make_image_folder(tmp_path / "other", num_classes=2, per_class=1, size=(40, 30))
    with pytest.raises(ValueError, match="same class folders"):
        module(folder, tmp_path / "f", val_root=str(other)).setup("fit")
    with pytest.raises(ValueError, match="augment_on"):
        module(folder, tmp_path / "f", augment_on="gpu")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("workers", "augment_on"), [(0, "workers"), (2, "workers"), (2, "device")])
def test_fit_from_the_cache(folder: Path, tmp_path: Path, workers: int, augment_on: str) -> None:
    dm = module(folder, tmp_path / "c", num_workers=workers, augment_on=augment_on)
    seen: list[torch.Tensor] = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # type: ignore[no-untyped-def]
            seen.append(batch[0])

    trainer = cpu_trainer(Spy(), epochs=1)
    trainer.fit(ImageClassifier(num_classes=dm.num_classes), dm)
    assert len(seen) == 2 and seen[0].shape == (8, 3, 24, 24) and seen[0].dtype == torch.float32
    assert "val_acc" in trainer.callback_metrics


def test_jpeg_cache_is_compact_rebuilt_on_change_and_trains(folder: Path, tmp_path: Path) -> None:
    """storage='jpeg': each image re-encoded once (shorter side cache_size), same samples and labels as raw."""
    raw = module(folder, tmp_path / "raw", cache_size=96)
    raw.prepare_data()
    raw.setup("fit")
    dm = module(folder, tmp_path / "jpeg", cache_size=96, storage="jpeg", quality=85, num_workers=2)
    dm.prepare_data()
    dm.setup("fit")
    files = sorted(p.name for p in (tmp_path / "jpeg").iterdir())
    assert files == ["manifest.json", "train.h5", "val.h5"]
    manifest = json.loads((tmp_path / "jpeg" / "manifest.json").read_text())
    assert manifest["params"]["storage"] == "jpeg" and manifest["params"]["quality"] == 85
    jpeg_bytes = sum(p.stat().st_size for p in (tmp_path / "jpeg").glob("*.h5"))
    raw_bytes = sum(p.stat().st_size for p in (tmp_path / "raw").glob("*.npy"))
    assert jpeg_bytes < raw_bytes / 4  # 64x48 sources are never upscaled: 96^2 raw squares vs 64x48 JPEGs
    assert dm.train_dataset.targets.tolist() == raw.train_dataset.targets.tolist()  # type: ignore[union-attr]
    assert len(dm.val_dataset) == len(raw.val_dataset) == 5  # type: ignore[arg-type]
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 24, 24) and images.dtype == torch.uint8
    trainer = cpu_trainer(max_steps=2)
    trainer.fit(ImageClassifier(num_classes=3, arch="resnet18"), dm)
    assert trainer.global_step == 2
    again = module(folder, tmp_path / "jpeg", cache_size=96, storage="jpeg", quality=70)  # stale: rebuilt
    again.prepare_data()
    assert json.loads((tmp_path / "jpeg" / "manifest.json").read_text())["params"]["quality"] == 70
    with pytest.raises(ValueError, match="storage changed from 'jpeg' to 'raw'"):
        module(folder, tmp_path / "jpeg", cache_size=96, read_only=True).prepare_data()
    with pytest.raises(ValueError, match="augment_on='device' needs storage='raw'"):
        module(folder, tmp_path / "x", storage="jpeg", augment_on="device")


def test_a_cache_written_before_storage_existed_is_still_current(folder: Path, tmp_path: Path) -> None:
    dm = module(folder, tmp_path / "c")
    dm.prepare_data()
    manifest_path = tmp_path / "c" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for key in ("storage", "quality"):
        del manifest["params"][key]
    manifest_path.write_text(json.dumps(manifest))
    before = (tmp_path / "c" / "train_images.npy").stat().st_mtime_ns
    module(folder, tmp_path / "c", read_only=True).prepare_data()  # no "parameters changed" error, no rebuild
    assert (tmp_path / "c" / "train_images.npy").stat().st_mtime_ns == before


def _age(root: Path, seconds: float = 60.0) -> None:
    """Date every folder under ``root`` back, as data written a while before the cache is built."""
    past = time.time() - seconds
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(folder, (past, past))


def _file_stats(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[str]:
    """Record every ``os.stat`` of an image file under ``root`` from now on."""
    calls: list[str] = []
    real = os.stat

    def counting(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = os.fsdecode(path)
        if name.endswith(".jpg") and str(root) in os.path.abspath(name):
            calls.append(name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting)
    return calls


def _built(capsys: pytest.CaptureFixture[str]) -> bool:
    return "building the tensor cache" in capsys.readouterr().out


def test_folder_check_stats_no_file_and_sees_added_and_renamed_files(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _age(folder)
    cache = tmp_path / "c"
    module(folder, cache, verify_source="folders").prepare_data()
    assert _built(capsys)
    stats = _file_stats(monkeypatch, folder)
    module(folder, cache, verify_source="folders").prepare_data()
    assert not _built(capsys) and stats == []  # current, from the folders alone: no file was stat'ed
    module(folder, cache).prepare_data()  # the default stats every file
    assert not _built(capsys) and len(stats) == 21
    # the parameters are still compared on the fast path
    with pytest.raises(ValueError, match="cache_size changed"):
        module(folder, cache, cache_size=40, verify_source="folders", read_only=True).prepare_data()

    # another split of the same files: the file lists differ, no folder does
    module(folder, cache, val_fraction=0.5, verify_source="folders").prepare_data()
    assert _built(capsys)
    assert json.loads((cache / "manifest.json").read_text())["counts"] == {"train": 11, "val": 10}

    # a file replaced by a rename (how careful tools write): its folder's mtime changes
    _age(folder)
    module(folder, cache, verify_source="folders").prepare_data()  # records the re-dated folders
    capsys.readouterr()
    target = folder / "class_001" / "img_000003.jpg"
    new = tmp_path / "new.jpg"
    new.write_bytes((folder / "class_002" / "img_000001.jpg").read_bytes())
    os.replace(new, target)
    module(folder, cache, verify_source="folders").prepare_data()
    assert _built(capsys)
    index = module(folder, cache).source.indexes(module(folder, cache).split)
    rows = [i for i in range(len(index[0])) if index[0].path(i) == str(target)]
    path, _ = open_tensor_cache(cache, "train")
    if rows:  # in the training split: the cache holds the new picture
        assert np.array_equal(np.load(path)[rows[0]], decode_center_crop(str(target), 32))

    # a file added: the file list changes
    _age(folder)
    module(folder, cache, verify_source="folders").prepare_data()
    capsys.readouterr()
    (folder / "class_000" / "img_extra.jpg").write_bytes(target.read_bytes())
    module(folder, cache, verify_source="folders").prepare_data()
    assert _built(capsys)
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["counts"]["train"] + manifest["counts"]["val"] == 22


def test_folder_check_misses_in_place_rewrites_as_documented(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _age(folder)
    module(folder, tmp_path / "c", verify_source="folders").prepare_data()
    capsys.readouterr()
    changed = folder / "class_001" / "img_000003.jpg"
    changed.write_bytes(changed.read_bytes() + b"\0")  # same name, same folder: no folder mtime changes
    module(folder, tmp_path / "c", verify_source="folders").prepare_data()
    assert not _built(capsys)  # the documented blind spot of verify_source="folders"
    module(folder, tmp_path / "c", verify_source="files").prepare_data()
    assert _built(capsys)  # the full check sees it


def test_folders_modified_during_the_build_get_the_full_check_once(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "c"
    module(folder, cache, verify_source="folders").prepare_data()  # the folder was written just now: racy
    manifest = json.loads((cache / "manifest.json").read_text())
    assert all(mtime == -1 for rows in manifest["source"]["folders"] for _, mtime in rows)
    _age(folder)  # time passes; nothing else changes
    capsys.readouterr()
    stats = _file_stats(monkeypatch, folder)
    module(folder, cache, verify_source="folders").prepare_data()
    assert not _built(capsys) and len(stats) == 21  # the full check, which found it current and recorded the folders
    manifest = json.loads((cache / "manifest.json").read_text())
    assert all(mtime > 0 for rows in manifest["source"]["folders"] for _, mtime in rows)
    stats.clear()
    module(folder, cache, verify_source="folders").prepare_data()
    assert not _built(capsys) and stats == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "c.lock", "src"]  # no temporary left beside it


def test_fingerprint_is_the_per_file_record_it_always_was(tmp_path: Path) -> None:
    """Caches built before the faster fingerprint stay current: same records, same digest, any file name."""
    import hashlib

    from lightning_fastdata.cache.source import fingerprint
    from lightning_fastdata.loading.index.files import scan_image_folder

    root = make_image_folder(tmp_path / "src", num_classes=2, per_class=3, size=(16, 16))
    odd = os.path.join(os.fsencode(root / "class_001"), b"caf\xe9 \xff.jpg")  # not UTF-8
    with open(odd, "wb") as fh:
        fh.write((root / "class_000" / "img_000000.jpg").read_bytes())
    index = scan_image_folder(str(root))
    digest = hashlib.sha256()
    for split in (index, None):
        digest.update(b"|split|")
        for i in range(len(split) if split is not None else 0):
            st = os.stat(split.path(i))
            record = f"{split.relpath(i)}\0{st.st_size}\0{st.st_mtime_ns}\0{split.labels[i]}\n"
            digest.update(record.encode(errors="surrogateescape"))
    assert len(index) == 7 and fingerprint([index, None]) == digest.hexdigest()


def test_folder_check_sees_a_linked_file_replaced_at_its_target(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A subset made of symlinks: replacing a target changes the target's folder, which is recorded too."""
    subset = tmp_path / "subset"
    for cls in ("class_000", "class_001"):
        (subset / cls).mkdir(parents=True)
        for i in range(3):
            os.symlink(folder / cls / f"img_{i:06d}.jpg", subset / cls / f"img_{i:06d}.jpg")
    _age(folder)
    _age(subset)
    cache = tmp_path / "c"
    module(subset, cache, verify_source="folders").prepare_data()
    manifest = json.loads((cache / "manifest.json").read_text())
    recorded = {name for rows in manifest["source"]["folders"] for name, _ in rows}
    assert {str(folder / "class_000"), str(folder / "class_001")} <= recorded
    module(subset, cache, verify_source="folders").prepare_data()
    capsys.readouterr()
    new = tmp_path / "new.jpg"
    new.write_bytes((folder / "class_002" / "img_000001.jpg").read_bytes())
    os.replace(new, folder / "class_001" / "img_000002.jpg")  # the subset's own folders do not change
    module(subset, cache, verify_source="folders").prepare_data()
    assert _built(capsys)


def test_exact_decode_is_part_of_what_a_cache_was_built_with(folder: Path, tmp_path: Path) -> None:
    dm = module(folder, tmp_path / "c")
    dm.prepare_data()
    default = np.load(tmp_path / "c" / "train_images.npy")
    with pytest.raises(ValueError, match="exact_decode changed from False to True"):
        module(folder, tmp_path / "c", exact_decode=True, read_only=True).prepare_data()
    module(folder, tmp_path / "c", exact_decode=True).prepare_data()  # stale: rebuilt with the exact decoder
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["params"]["exact_decode"] is True
    exact = np.load(tmp_path / "c" / "train_images.npy")
    assert exact.shape == default.shape and not np.array_equal(exact, default)  # fast IDCT vs exact: close
    assert np.abs(exact.astype(np.int16) - default).mean() < 2.0
