from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fastdata import convert_folder_to_hdf5
from lightning_fastdata.cli import main, run_cli
from lightning_fastdata.demos import ensure_demo_data

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "imagefolder.yaml", "hdf5.yaml", "cache.yaml"}


def data_source_args(config: Path, image_folder: Path, tmp_path: Path) -> list[str]:
    """Point a config at test data of the kind it reads."""
    if "HDF5DataModule" in config.read_text():
        h5 = convert_folder_to_hdf5(
            image_folder, tmp_path / "data.h5", mode="raw", size=40, processes=1, progress=False
        )
        return ["--data.init_args.path", str(h5)]
    if "TensorCacheDataModule" in config.read_text():
        return [
            "--data.init_args.root",
            str(image_folder),
            "--data.init_args.cache_dir",
            str(tmp_path / "cache"),
            "--data.init_args.cache_size",
            "40",
        ]
    return ["--data.init_args.root", str(image_folder)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config_parses_and_smoke_runs(
    config: Path, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # configs write relative paths (checkpoints/...): never into the checkout
    cli = run_cli(
        [
            "fit",
            "--config",
            str(config),
            *data_source_args(config, image_folder, tmp_path),
            "--data.init_args.image_size",
            "32",
            "--data.init_args.num_workers",
            "0",
            "--trainer.fast_dev_run",
            "true",
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "1",
            "--model.arch",
            "resnet18",
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    assert cli.model.hparams["num_classes"] == 3  # linked from the DataModule
    assert cli.trainer.state.finished


def test_demo_data_is_generated_once(tmp_path: Path) -> None:
    root = ensure_demo_data(str(tmp_path / "demo"), num_classes=2, per_class=2, processes=1)
    assert len(list(root.glob("*/*.jpg"))) == 4 and (root / ".complete").exists()
    first = next(root.glob("*/*.jpg"))
    mtime = first.stat().st_mtime_ns
    ensure_demo_data(str(root), num_classes=2, per_class=2, processes=1)
    assert first.stat().st_mtime_ns == mtime


@pytest.mark.timeout(300)
def test_fastdata_console_script_fits(image_folder: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("fastdata")
    out = subprocess.run(
        [
            str(exe),
            "fit",
            "--config",
            str(CONFIGS[0].with_name("demo.yaml")),
            "--data.init_args.root",
            str(image_folder),
            "--data.init_args.image_size",
            "32",
            "--trainer.max_epochs",
            "1",
            "--trainer.accelerator",
            "cpu",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "images/s per rank" in out.stdout + out.stderr and "waiting for data" in out.stdout + out.stderr


def test_fastdata_convert_refuses_to_overwrite(image_folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "x.h5"
    main(["convert", "hdf5", "--src", str(image_folder), "--dst", str(dst), "--processes", "1"])
    assert dst.exists()
    with pytest.raises(SystemExit, match="overwrite"):
        main(["convert", "hdf5", "--src", str(image_folder), "--dst", str(dst)])
    main(
        [
            "convert",
            "hdf5",
            "--src",
            str(image_folder),
            "--dst",
            str(dst),
            "--overwrite",
            "--mode",
            "raw",
            "--size",
            "24",
        ]
    )


def _fit(args: list[str], cwd: Path, record: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTDATA_RECORD": str(record), "PYTHONPATH": str(Path(__file__).with_name("helpers"))}
    fastdata = Path(sys.executable).with_name("fastdata")
    return subprocess.run([str(fastdata), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_documented_resume_command_continues_at_the_step_and_sample(image_folder: Path, tmp_path: Path) -> None:
    """README: the same command with --ckpt_path last resumes (a second run, a new logger version)."""
    config = Path(__file__).parents[1] / "configs" / "callback_resume.yaml"
    common = ["fit", "--config", str(config), "--data.init_args.root", str(image_folder)]
    common += ["--data.init_args.image_size", "16", "--data.init_args.batch_size", "4", "--data.init_args.num_workers"]
    common += ["0", "--data.init_args.val_fraction", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1"]
    common += ["--trainer.enable_progress_bar", "false", "--trainer.callbacks+=step_recorder.StepRecorder"]
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    ref = _fit([*common, "--trainer.max_steps", "10"], tmp_path / "ref", tmp_path / "ref.jsonl")
    assert ref.returncode == 0, ref.stderr[-3000:]
    nothing = _fit([*common, "--trainer.max_steps", "5", "--ckpt_path", "last"], tmp_path / "run", tmp_path / "a.jsonl")
    assert nothing.returncode == 0, nothing.stderr[-3000:]
    assert "no last checkpoint" in nothing.stderr + nothing.stdout  # a first run with nothing to resume says so
    resumed = _fit(
        [*common, "--trainer.max_steps", "10", "--ckpt_path", "last"], tmp_path / "run", tmp_path / "b.jsonl"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "checkpoints/resume/last.ckpt" in resumed.stderr + resumed.stdout
    lines = [json.loads(x) for x in (tmp_path / "ref.jsonl").read_text().splitlines()]
    first = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    second = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first] == [0, 1, 2, 3, 4] and [r["step"] for r in second] == [5, 6, 7, 8, 9]
    assert first + second == lines  # same epochs, steps, batch indices and samples as the uninterrupted run
    assert all(r["epoch"] == 0 for r in second)  # 39 images / 4: all 10 steps are in epoch 0


def test_commands_do_not_warn_about_lightningcli_args() -> None:
    """`fastdata fit --help` is LightningCLI reading the command line: no "args is meant for Python" warning."""
    fastdata = Path(sys.executable).with_name("fastdata")
    out = subprocess.run([str(fastdata), "fit", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--data" in out.stdout and "--ckpt_path" in out.stdout
    assert "args" not in out.stderr, out.stderr[-2000:]


def test_fastdata_help_lists_every_command_and_each_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    listed = capsys.readouterr().out
    for command in ("fit", "demo", "make-data", "convert", "bench"):
        assert f"\n  {command}" in listed or f" {command}," in listed, command
    for command in (["make-data"], ["demo"], ["convert"], ["bench"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert f"fastdata {command[0]}" in out and ("example:" in out or "fastdata bench" in out), out[-500:]
