"""``fastdata doctor``: read-only on the data, numbers consistent with a direct benchmark, clear bad-input errors."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from lightning_fastdata import doctor
from lightning_fastdata.bench.harness import compare_folder_loaders
from lightning_fastdata.cli import main as fastdata
from lightning_fastdata.cli import run_cli
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.diagnose import main


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_image_folder(tmp_path_factory.mktemp("doctor") / "train", num_classes=3, per_class=20, size=(200, 150))
    bad = root / "class_002" / "img_000003.jpg"
    bad.write_bytes(bad.read_bytes()[:300])  # truncated: the doctor's sample covers every file here
    return root


@pytest.mark.timeout(300)
def test_doctor_reports_measures_and_recommends_without_touching_the_data(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(photos)
    config = tmp_path / "fast.yaml"
    report = main(
        [str(photos), "--seconds", "6", "--batch-size", "8", "--image-size", "64", "--step-ms", "5", "--sample",
         "64", "--write-config", str(config)]
    )  # fmt: skip
    assert snapshot(photos) == before  # file list, sizes and mtimes unchanged
    assert not list(photos.parent.glob("*cache*"))  # nothing beside the data either
    assert report.files == 60 and report.classes == 3 and report.sampled == 60
    assert report.corrupt == [str(photos / "class_002" / "img_000003.jpg")]
    assert report.formats == {"jpeg": 59}
    names = [o.name for o in report.options]
    assert names[:2] == ["torchvision ImageFolder (baseline)", "ImageFolderDataModule"]
    assert all(o.images_per_s > 0 for o in report.options)
    sizes = {o.name: o.kb_per_image for o in report.options}
    assert sizes["TensorCacheDataModule(storage='jpeg')"] < sizes["TensorCacheDataModule(storage='raw')"]
    assert report.recommendation in names and report.expected_wait_fraction is not None
    printed = capsys.readouterr().out
    assert "Recommendation:" in printed and "corrupt: " in printed and "| option |" in printed
    # the written config names the recommended module and parses as a `fastdata fit` config
    data = yaml.safe_load(config.read_text())["data"]
    assert data["class_path"].rsplit(".", 1)[1] == report.recommendation.split("(")[0]
    assert data["init_args"]["root"] == str(photos)


@pytest.mark.timeout(300)
def test_doctor_figures_agree_with_a_direct_benchmark(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "d", num_classes=2, per_class=48, size=(320, 240))
    report = doctor(str(root), batch_size=16, image_size=96, seconds=4, sample=96)
    direct = compare_folder_loaders(str(root), 96, 16, report.workers_per_rank, min_seconds=1.0)
    by_name = {o.name: o.images_per_s for o in report.options}
    # same data, workers and harness; 2-core VMs are noisy, so within a factor of 2
    assert 0.5 < by_name["torchvision ImageFolder (baseline)"] / direct["baseline"] < 2.0
    assert 0.5 < by_name["ImageFolderDataModule"] / direct["ours"] < 2.0


def test_written_config_trains(photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean = make_image_folder(tmp_path / "clean", num_classes=2, per_class=8, size=(64, 48))
    config = tmp_path / "fast.yaml"
    main([str(clean), "--seconds", "2", "--batch-size", "4", "--image-size", "32", "--write-config", str(config)])
    monkeypatch.chdir(tmp_path)
    cli = run_cli(
        ["fit", "--config", str(config), "--trainer.fast_dev_run", "true", "--trainer.accelerator", "cpu",
         "--trainer.devices", "1", "--model.arch", "resnet18", "--data.init_args.num_workers", "0"]
    )  # fmt: skip
    assert cli.trainer.state.finished


@pytest.mark.parametrize("case", ["missing", "empty", "not_hdf5", "no_images"])
def test_bad_input_gives_a_clear_message(tmp_path: Path, case: str) -> None:
    target = tmp_path / case
    if case == "empty":
        target.mkdir()
    elif case == "not_hdf5":
        target.write_bytes(b"this is not HDF5")
    elif case == "no_images":
        (target / "a").mkdir(parents=True)
        (target / "a" / "notes.txt").write_text("x")
    with pytest.raises(SystemExit) as err:
        fastdata(["doctor", str(target), "--seconds", "1"])  # through the `fastdata` command
    message = str(err.value.code)
    assert message.startswith("fastdata doctor: ") and str(target) in message
    expected = {"missing": "does not exist", "empty": "class folder", "not_hdf5": "HDF5", "no_images": "no valid image"}
    assert expected[case].lower() in message.lower()


def test_hdf5_file(tmp_path: Path) -> None:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.random.default_rng(0).integers(0, 255, (40, 48, 48, 3), dtype=np.uint8))
        f.create_dataset("labels", data=np.arange(40) % 4)
    before = (path.stat().st_size, path.stat().st_mtime_ns)
    report = doctor(str(path), batch_size=8, image_size=32, seconds=2)
    assert report.kind == "hdf5" and report.files == 40 and report.classes == 4
    assert report.recommendation == "HDF5DataModule (hwc)" and report.options[0].images_per_s > 0
    assert (path.stat().st_size, path.stat().st_mtime_ns) == before
    assert os.listdir(tmp_path) == ["d.h5"]
