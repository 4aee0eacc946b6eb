"""Node-local copies built from a bucket: the tensor cache (raw and compact JPEG) and the HDF5 conversion.

Each is compared with the same build from the local folder the bucket was uploaded from, on a real S3 server.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from benchmarks.s3_server import LocalS3, delete_objects, upload_folder
from lightning_fastdata import TensorCacheDataModule, convert_folder_to_hdf5
from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.storage.object_store import main_process_is_clean


def first_batches(dm: TensorCacheDataModule, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dm.setup("fit")
    out = []
    for images, labels in dm.train_dataloader():
        out.append((images.clone(), labels.clone()))
        if len(out) == n:
            break
    return out


def arrays(cache_dir: Path) -> dict[str, np.ndarray]:
    return {p.name: np.load(p) for p in sorted(cache_dir.glob("*.npy"))}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_a_cache_built_from_a_bucket_equals_the_one_built_from_the_folder(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path, storage: str
) -> None:
    kw = dict(cache_size=40, image_size=32, batch_size=6, num_workers=2, val_fraction=0.25, seed=1, storage=storage)
    bucket = TensorCacheDataModule(
        s3_image_folder, str(tmp_path / "bucket"), storage_options=s3.storage_options(), build_processes=2, **kw
    )
    local = TensorCacheDataModule(str(image_folder), str(tmp_path / "local"), build_processes=2, **kw)
    bucket.prepare_data()
    local.prepare_data()
    if storage == "raw":
        got, want = arrays(tmp_path / "bucket"), arrays(tmp_path / "local")
        assert got.keys() == want.keys() and "train_images.npy" in got
        for name in got:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    else:
        for split in ("train", "val"):
            with (
                h5py.File(tmp_path / "bucket" / f"{split}.h5") as g,
                h5py.File(tmp_path / "local" / f"{split}.h5") as w,
            ):
                assert np.array_equal(g["images"][()], w["images"][()]) and np.array_equal(g["labels"], w["labels"])
                assert g.attrs["source"] == s3_image_folder
    for (gi, gl), (wi, wl) in zip(first_batches(bucket), first_batches(local), strict=True):
        assert torch.equal(gl, wl) and torch.equal(gi, wi)
    assert "secret_access_key" not in bucket.hparams["storage_options"]
    assert main_process_is_clean()  # the build read the bucket in its pool, not in this process


@pytest.mark.timeout(300)
def test_a_changed_object_is_seen_and_the_cache_rebuilt(
    s3: LocalS3, image_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = s3.url(f"changes-{uuid.uuid4().hex[:8]}")
    upload_folder(image_folder, url, s3.storage_options())
    cache = tmp_path / "cache"
    kw = dict(cache_size=32, image_size=24, num_workers=0, val_fraction=0.0, build_processes=2)

    def build() -> float:
        dm = TensorCacheDataModule(url, str(cache), storage_options=s3.storage_options(), **kw)
        dm.prepare_data()
        return (cache / "manifest.json").stat().st_mtime_ns

    first = build()
    assert build() == first  # same listing (keys, sizes, ETags): reused, not rebuilt
    # rewrite one object in place under the same key: only its ETag (and size) tell
    cls = sorted(p.name for p in image_folder.iterdir())[0]
    names = sorted(p.name for p in (image_folder / cls).iterdir())
    changed = tmp_path / "changed"
    shutil.copytree(image_folder / cls, changed / cls)
    shutil.copy(image_folder / cls / names[1], changed / cls / names[0])
    upload_folder(changed, url, s3.storage_options())
    before = np.load(cache / "train_images.npy")[0].copy()
    with caplog.at_level(logging.INFO):
        assert build() != first
    after = np.load(cache / "train_images.npy")
    assert not np.array_equal(after[0], before) and np.array_equal(after[0], after[1])  # image 0 is now image 1's


@pytest.mark.timeout(300)
def test_hdf5_conversion_from_a_bucket_equals_the_local_conversion(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    opts = s3.storage_options()
    for name, kw in {
        "raw": dict(mode="raw", size=24),
        "encoded": dict(mode="encoded"),
        "compact": dict(mode="encoded", max_side=40),
    }.items():
        got = convert_folder_to_hdf5(
            s3_image_folder, tmp_path / f"b-{name}.h5", storage_options=opts, processes=2, **kw
        )
        want = convert_folder_to_hdf5(str(image_folder), tmp_path / f"l-{name}.h5", processes=2, **kw)
        with h5py.File(got) as g, h5py.File(want) as w:
            assert set(g) == set(w)
            for key in w:
                assert np.array_equal(g[key][()], w[key][()]), (name, key)
            assert g.attrs["source"] == s3_image_folder and g.attrs["classes"] == w.attrs["classes"]
    assert main_process_is_clean()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_convert_cli_reads_a_bucket_configured_by_the_environment(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "cli.h5"
    env = {**os.environ, **s3.env()}
    cmd = [sys.executable, "-m", "lightning_fastdata.cli", "convert", "hdf5", "--src", s3_image_folder, "--dst"]
    out = subprocess.run([*cmd, str(dst), "--mode", "raw", "--size", "16"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    with h5py.File(dst) as f:
        assert len(f["labels"]) == sum(1 for _ in image_folder.rglob("*.jpg")) and f["images"].shape[1:] == (16, 16, 3)
    assert s3.secret_access_key not in out.stdout + out.stderr


@pytest.mark.timeout(300)
def test_a_missing_object_fails_the_build_naming_its_url(s3: LocalS3, image_folder: Path, tmp_path: Path) -> None:
    url = s3.url(f"missing-{uuid.uuid4().hex[:8]}")
    upload_folder(image_folder, url, s3.storage_options())
    from lightning_fastdata.datamodules.folder import FolderSource

    source = FolderSource(url, storage_options=s3.storage_options())
    index = source.index(url)
    # the object is deleted after the listing: the build reads a key that is gone
    gone = index.relpath(3)
    delete_objects(url, [gone], s3.storage_options())
    with pytest.raises(DataError, match=re.escape(f"{url}/{gone}")):
        convert_folder_to_hdf5(index, tmp_path / "x.h5", processes=2, storage=source.storages[url])
    assert not (tmp_path / "x.h5").exists()
