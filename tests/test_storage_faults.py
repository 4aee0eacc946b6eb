"""Storage that fails, restarts or changes under a run: never a "successful" run on the wrong samples or on none.

Against a real S3 server (SeaweedFS on 127.0.0.1): a 503 storm through the fault proxy, the server killed and
started again mid-epoch, an object rewritten after the listing; and a folder with too many corrupt images.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3_server import LocalS3, local_s3_server, upload_folder
from lightning_fastdata import ImageClassifier, ImageFolderDataModule
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.errors import DataError, StorageError
from lightning_fastdata.testing import cpu_trainer


def epoch(dm: ImageFolderDataModule) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dm.setup("fit")
    return [(x.clone(), y.clone()) for x, y in dm.train_dataloader()]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
def test_a_503_storm_fails_the_run_with_a_storage_error_whatever_on_corrupt_says(
    s3: LocalS3, s3_image_folder: str, tmp_path: Path, on_corrupt: str
) -> None:
    """Every object GET answers 503 SlowDown (listing works): was an epoch of 0 samples and one warning."""
    with fault_proxy(s3.endpoint, slowdown={".jpg": 10**6}) as proxy:
        options = s3.storage_options(proxy.endpoint, retry_timeout=2, max_retries=1)
        dm = ImageFolderDataModule(
            s3_image_folder, storage_options=options, image_size=16, batch_size=8, num_workers=2, val_fraction=0,
            on_corrupt=on_corrupt,  # type: ignore[arg-type]
        )  # fmt: skip
        start = time.perf_counter()
        with pytest.raises(StorageError, match=r"(?s)Could not read s3://.*\.jpg.*503.*not a corrupt image") as raised:
            cpu_trainer(default_root_dir=tmp_path).fit(ImageClassifier(num_classes=3, arch="resnet18"), dm)
        took = time.perf_counter() - start
    assert "retry_timeout" in str(raised.value)  # how long it was retried, and the setting that says so
    assert took < 60, f"a 2 s retry budget held the run {took:.0f} s"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_five_second_server_outage_mid_epoch_is_a_pause_with_the_same_samples(
    tmp_path: Path, image_folder: Path
) -> None:
    """The S3 server is killed mid-epoch and started again 5 s later: the epoch ends with the undisturbed samples."""
    with local_s3_server(tmp_path / "s3") as server:
        url = server.url("train")
        upload_folder(image_folder, url, server.storage_options())

        def module() -> ImageFolderDataModule:
            return ImageFolderDataModule(
                url, storage_options=server.storage_options(timeout=2, connect_timeout=1), image_size=16,
                batch_size=2, num_workers=2, prefetch_factor=1, val_fraction=0, seed=3,
            )  # fmt: skip

        undisturbed = epoch(module())
        dm = module()
        dm.setup("fit")
        got, outage = [], threading.Thread(target=server.outage, args=(5.0,))
        start = time.perf_counter()
        try:
            for step, (x, y) in enumerate(dm.train_dataloader()):
                got.append((x.clone(), y.clone()))
                if step == 2:  # the rest of the epoch is read while the server is down, then from the restarted one
                    outage.start()
            took = time.perf_counter() - start
        finally:
            if outage.is_alive():
                outage.join()
    assert took > 5, f"the epoch took {took:.1f} s: the outage did not overlap its reads"
    assert server.process is not None and len(server.process.grpc_sockets) == 5
    assert not [p for p in server.process.grpc_sockets if p.exists()]  # weed's /tmp sockets gone, after a SIGKILL too
    assert len(got) == len(undisturbed)
    for (x, y), (ux, uy) in zip(got, undisturbed, strict=True):
        assert torch.equal(y, uy) and torch.equal(x, ux)


REWRITE = """
import json, sys
import numpy as np
from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.demos import photo_like_image
from benchmarks.s3_server import upload_folder

url, options, tmp = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
dm = ImageFolderDataModule(url, storage_options=options, image_size=16, batch_size=8, num_workers=2, val_fraction=0)
dm.setup("fit")  # listed now
photo_like_image(np.random.default_rng(9), 50, 60, hue=0.7).save(tmp + "/new/class_001/img_000004.jpg", quality=80)
upload_folder(tmp + "/new", url, options)  # the same key, other bytes
print(sum(len(y) for _ in range(2) for _, y in dm.train_dataloader()))  # two epochs
"""


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_an_object_rewritten_after_the_listing_is_served_new_and_named_once(
    s3: LocalS3, image_folder: Path, tmp_path: Path
) -> None:
    """Run as a script: loader workers log to their own stderr, which pytest's logging capture hides in a test."""
    url = s3.url("rewritten")
    upload_folder(image_folder, url, s3.storage_options())
    (tmp_path / "new" / "class_001").mkdir(parents=True)
    args = [url, json.dumps(s3.storage_options()), str(tmp_path)]
    out = subprocess.run([sys.executable, "-c", REWRITE, *args], capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["78"]  # every sample of both epochs, the rewritten one with its new content
    changed = f"{url}/class_001/img_000004.jpg changed since the bucket was listed"
    assert out.stderr.count(changed) == 1, out.stderr[-3000:]  # once per object and process: one worker read it
    assert out.stderr.count("changed since the bucket was listed") == 1  # no other object is named


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_skipping_corrupt_images_stops_past_max_corrupt_fraction(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "d", num_classes=3, per_class=13, size=(48, 40))
    for name in ("class_000/img_000001.jpg", "class_001/img_000002.jpg", "class_002/img_000003.jpg"):
        (root / name).write_bytes((root / name).read_bytes()[:200])  # truncated: corrupt, read fine
    common = dict(image_size=16, batch_size=4, num_workers=2, val_fraction=0, on_corrupt="skip")
    # 3 of 39 skipped: past the default 1% (ceil: 1 allowed), within 10% (4 allowed)
    with pytest.raises(
        DataError, match=r"2 corrupt image\(s\) skipped in epoch 0, more than max_corrupt_fraction=0.01"
    ) as info:
        cpu_trainer(default_root_dir=tmp_path).fit(
            ImageClassifier(num_classes=3, arch="resnet18"), ImageFolderDataModule(str(root), **common)
        )
    # what applies to a user who already skips: not the last file's own advice to pass on_corrupt='skip'
    message = str(info.value)
    assert "pass on_corrupt='skip'" not in message and ".." not in message and "Cannot decode image" in message
    dm = ImageFolderDataModule(str(root), max_corrupt_fraction=0.1, **common)  # type: ignore[arg-type]
    assert sum(len(y) for _, y in epoch(dm)) == 36
    assert dm.train_dataset.skipped_count() == 3  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="max_corrupt_fraction"):
        ImageFolderDataModule(str(root), max_corrupt_fraction=1.5)


def files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_no_artifact_of_a_fit_holds_the_secret_key(s3: LocalS3, s3_image_folder: str, tmp_path: Path) -> None:
    """CSV and TensorBoard logger folders, checkpoints: Lightning writes hparams_initial to hparams.yaml itself."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    options = s3.storage_options()
    dm = ImageFolderDataModule(
        s3_image_folder, storage_options=options, image_size=16, batch_size=8, num_workers=0, val_fraction=0
    )
    trainer = pl.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=[CSVLogger(tmp_path / "csv"), TensorBoardLogger(tmp_path / "tb")],
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=1)],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(ImageClassifier(num_classes=3, arch="resnet18"), dm)
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert "hparams.yaml" in written and any(n.startswith("events.out.tfevents") for n in written), written
    assert any(n.endswith(".ckpt") for n in written), written
    assert files_holding(tmp_path, s3.access_key_id)  # the hyper-parameters were written, the key id with them
    assert files_holding(tmp_path, s3.secret_access_key) == []


def test_every_kind_of_secret_is_dropped_from_what_is_written() -> None:
    from lightning_fastdata.hparams import without_secrets

    secrets = ["secret_access_key", "aws_session_token", "token", "azure_storage_sas_key", "service_account_key"]
    kept = ["endpoint", "access_key_id", "region", "max_inflight"]
    assert list(without_secrets({k: "x" for k in secrets + kept})) == kept


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fastdata_fit_saves_a_config_without_the_secret_key(
    s3: LocalS3, s3_image_folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_fastdata.cli import run_cli

    monkeypatch.chdir(tmp_path)
    data = [
        "--data.init_args.root",
        s3_image_folder,
        "--data.init_args.storage_options",
        json.dumps(s3.storage_options()),
    ]
    data += [
        "--data.init_args.image_size",
        "16",
        "--data.init_args.num_workers",
        "0",
        "--data.init_args.batch_size",
        "8",
    ]
    trainer = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.accelerator", "cpu"]
    trainer += ["--trainer.devices", "1", "--trainer.default_root_dir", str(tmp_path), "--model.arch", "resnet18"]
    cli = run_cli(["fit", "--config", "imagefolder", *data, *trainer])
    assert cli.trainer.state.finished
    (config,) = tmp_path.rglob("config.yaml")
    assert s3.access_key_id in config.read_text() and "storage_options" in config.read_text()
    assert files_holding(tmp_path, s3.secret_access_key) == []
