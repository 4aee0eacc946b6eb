"""``fastdata doctor s3://...``: the doctor on a bucket of the local S3 server, read-only, configs on the URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.s3_server import LocalS3
from lightning_fastdata.diagnose.report import write_config
from lightning_fastdata.diagnose.run import doctor

STREAMED = "ImageFolderDataModule (streamed from the bucket)"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_doctor_on_a_bucket_times_every_option_and_writes_configs_on_the_url(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    report = doctor(
        s3_image_folder,
        batch_size=8,
        image_size=32,
        seconds=3,
        sample=24,
        scratch_dir=str(tmp_path),
        storage_options=s3.storage_options(),
    )
    assert report.kind == "bucket" and report.path == s3_image_folder
    assert report.files == sum(1 for _ in image_folder.rglob("*.jpg")) and report.sampled == 24
    assert report.read_mb_s_warm > 0 and report.request_ms > 0 and report.read_mb_s_cold >= report.read_mb_s_warm
    options = {o.name: o for o in report.options}
    assert STREAMED in options and any(o.key == "cache-raw" for o in report.options)
    for o in report.options:
        assert o.images_per_s > 0, o.name
        if o.config:
            root = o.config["init_args"].get("root")
            if o.config["class_path"].endswith("HDF5DataModule"):  # the file its one-time command writes
                assert root.startswith("cache/") and o.prepare and f"--dst {root}" in o.prepare, o.name
            else:
                assert root in (None, s3_image_folder), o.name  # never the scratch copy of the sample
    streamed = options[STREAMED]
    assert streamed.expected_per_s <= streamed.images_per_s
    assert streamed.config["init_args"]["index_dir"] == "cache/index"
    assert any(o.prepare.startswith(f"fastdata convert hdf5 --src {s3_image_folder} ") for o in report.options)
    config = write_config(report, str(tmp_path / "fast.yaml"), storage_options=s3.storage_options())
    text = config.read_text()
    assert s3.secret_access_key not in text and s3_image_folder in text
    init = yaml.safe_load(text)["data"]["init_args"]
    public = {k: v for k, v in s3.storage_options().items() if "secret" not in k}
    assert init["storage_options"] == public and "endpoint" in public  # the endpoint kept, by its key
    assert "# Left out: secret_access_key (secrets are never written)" in text
    assert "storage_options " in text.split("# Kept from your setup: ")[1].splitlines()[0]
    plain = write_config(report, str(tmp_path / "env.yaml")).read_text()  # configured by the environment
    assert "come from the environment" in plain and "storage_options" not in plain
    assert not list(tmp_path.glob("fastdata-doctor-*"))  # the scratch directory is removed


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_doctor_cli_on_a_bucket_configured_by_the_environment(
    s3: LocalS3, s3_image_folder: str, tmp_path: Path
) -> None:
    config = tmp_path / "fast.yaml"
    args = ["doctor", s3_image_folder, "--batch-size", "8", "--image-size", "32", "--seconds", "3", "--sample", "16"]
    args += ["--scratch-dir", str(tmp_path), "--write-config", str(config)]
    out = subprocess.run(
        [sys.executable, "-m", "lightning_fastdata.cli", *args],
        env={**os.environ, **s3.env()},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"fastdata doctor: {s3_image_folder} (bucket)" in out.stdout
    assert "bucket: one process fetched the sample at" in out.stdout
    assert s3.secret_access_key not in out.stdout + out.stderr + config.read_text()
