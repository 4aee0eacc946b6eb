"""``ImageFolderDataModule`` on an ``s3://`` root: same batches as the local folder, the listing kept per node."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from benchmarks.s3_server import LocalS3, upload_folder
from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.loading.storage.object_store import main_process_is_clean
from lightning_fastdata.models import ImageClassifier
from lightning_fastdata.testing import cpu_trainer


def batches(dm: ImageFolderDataModule, split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
    dm.setup("fit")
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    return [(images.clone(), labels.clone()) for images, labels in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_bucket_batches_equal_the_local_folders(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, workers: int
) -> None:
    kw = dict(image_size=24, batch_size=5, num_workers=workers, val_fraction=0.3, seed=3)
    bucket = ImageFolderDataModule(s3_image_folder, storage_options=s3.storage_options(), **kw)
    local = ImageFolderDataModule(str(image_folder), **kw)
    assert bucket.classes == local.classes
    for split in ("train", "val"):
        got, want = batches(bucket, split), batches(local, split)
        assert len(got) == len(want) > 1
        for (gi, gl), (wi, wl) in zip(got, want):
            assert torch.equal(gl, wl) and torch.equal(gi, wi)
    assert main_process_is_clean()


def test_the_listing_is_kept_reused_within_its_ttl_and_relisted_after(
    s3: LocalS3, image_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = s3.url("ttl-test")
    upload_folder(image_folder, url, s3.storage_options())
    opts = dict(storage_options=s3.storage_options(), index_dir=str(tmp_path / "idx"), image_size=16, num_workers=0)
    caplog.set_level(logging.INFO, logger="lightning.pytorch")
    first = ImageFolderDataModule(url, **opts)
    first.prepare_data()
    assert "listed 's3://data/ttl-test' (39 files" in caplog.text
    caplog.clear()
    ImageFolderDataModule(url, **opts).prepare_data()
    assert "reused the file index" in caplog.text and "within index_ttl=3600 s; no request made" in caplog.text
    caplog.clear()
    ImageFolderDataModule(url, index_ttl=0, **opts).prepare_data()
    assert "(index_ttl=0 s); listed again: nothing changed" in caplog.text
    # a new image in one class: the next listing after the TTL names the class and trains on 40 files
    extra = next(image_folder.glob("class_001/*.jpg"))
    upload_folder(extra.parent, url + "/class_001/copy", s3.storage_options())
    dm = ImageFolderDataModule(url, index_ttl=0, val_fraction=0.0, **opts)
    with pytest.warns(UserWarning, match=r"listed again: 1 class\(es\) changed \(class_001\)"):
        dm.prepare_data()
    caplog.clear()
    dm.setup("fit")  # the listing prepare_data made in this process, not another one
    assert "listed" not in caplog.text
    assert len(dm.train_dataset) == 39 + 13  # type: ignore[attr-defined, arg-type]


@pytest.mark.slow
def test_fit_from_a_bucket_with_workers_and_no_secret_in_the_checkpoint(
    s3: LocalS3, s3_image_folder: str, tmp_path: Path
) -> None:
    dm = ImageFolderDataModule(
        s3_image_folder, storage_options=s3.storage_options(), image_size=16, batch_size=8, num_workers=2
    )
    trainer = cpu_trainer(epochs=1, default_root_dir=tmp_path, enable_checkpointing=True)
    trainer.fit(ImageClassifier(num_classes=dm.num_classes), dm)
    assert trainer.global_step == 5  # 35 training images (4 of 39 held out), batch 8
    ckpt = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=False)
    saved = ckpt["datamodule_hyper_parameters"]["storage_options"]
    assert saved["access_key_id"] == s3.access_key_id and "secret_access_key" not in saved
    assert s3.secret_access_key not in repr(ckpt)
    assert main_process_is_clean()


def test_entropy_index_built_from_the_bucket_gives_the_local_folders_batches(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    kw = dict(image_size=24, batch_size=5, num_workers=2, val_fraction=0.3, seed=3)
    bucket = ImageFolderDataModule(
        s3_image_folder, storage_options=s3.storage_options(), index_dir=str(tmp_path / "idx"), entropy_index=True, **kw
    )
    bucket.prepare_data()  # every object read once, in a process pool, from the bucket
    assert list((tmp_path / "idx").glob("entropy-*/meta.json"))
    local = ImageFolderDataModule(str(image_folder), **kw)
    got, want = batches(bucket), batches(local)
    assert bucket.train_dataset.entropy_index_of(0) is not None  # type: ignore[union-attr]
    assert len(got) == len(want) > 1
    for (gi, gl), (wi, wl) in zip(got, want):
        assert torch.equal(gl, wl) and torch.equal(gi, wi)
    assert main_process_is_clean()
