from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.fork_client import SERVER
from helpers.masks import mask_folder

from lightning_fastdata import convert_folder_to_hdf5
from lightning_fastdata.cli import CONFIG_DIR, DEMO_CPU_ARCH, ConfigNotFoundError, find_config, main, run_cli
from lightning_fastdata.demos import ensure_demo_data

CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))  # the one copy: the package's (the wheel ships them)


def test_there_are_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "imagefolder.yaml", "hdf5.yaml", "cache.yaml"}


def data_source_args(config: Path, image_folder: Path, tmp_path: Path) -> list[str]:
    """Point a config at test data of the kind it reads."""
    if "SegmentationDataModule" in config.read_text():  # 3 of the scenes' classes: the same count as the folder's
        from lightning_fastdata.segmentation.demos import make_segmentation_folder

        root = make_segmentation_folder(tmp_path / "scenes", count=8, size=(80, 60))
        sizes = ["--data.init_args.base_size", "40", "--data.init_args.crop_size", "32"]
        classes = ["--data.init_args.num_classes", "3", "--data.init_args.class_names", "[a, b, c]"]
        labels = ["--data.init_args.label_map", "{0: 0, 1: 1, 2: 2, 3: 2, 4: 2, 5: 2}"]
        return ["--data.init_args.root", str(root), *sizes, *classes, *labels]
    if "HDF5DataModule" in config.read_text():
        h5 = convert_folder_to_hdf5(
            image_folder, tmp_path / "data.h5", mode="raw", size=40, processes=1, progress=False
        )
        return ["--data.init_args.root", str(h5)]
    if "TensorCacheDataModule" in config.read_text():
        return [
            "--data.init_args.root",
            str(image_folder),
            "--data.init_args.cache_dir",
            str(tmp_path / "cache"),
            "--data.init_args.cache_size",
            "40",
        ]
    if "ShardDataModule" in config.read_text():  # the hubs' Parquet layout (the tar path has its own tests)
        from lightning_fastdata.convert.shards import write_parquet_shards

        write_parquet_shards(image_folder, tmp_path / "parquet", shard_bytes=20_000, rows_per_group=8)
        return ["--data.init_args.root", str(tmp_path / "parquet"), "--data.init_args.index_dir", str(tmp_path)]
    if "DetectionDataModule" in config.read_text():  # COCO scenes of 5 classes, 3 of them kept
        from lightning_fastdata.detection.demos import make_detection_folder

        root = make_detection_folder(tmp_path / "boxes", count=8, layout="coco")
        return ["--data.init_args.root", str(root), "--data.init_args.classes", "[red, green, blue]"]
    if "ImageTextDataModule" in config.read_text():  # the captions demo's shards, train and val
        from lightning_fastdata.captions.demos import make_caption_shards

        root = make_caption_shards(tmp_path / "pairs", count=20, size=(64, 48))
        split = ["--data.init_args.val_root", str(root / "val"), "--data.init_args.index_dir", str(tmp_path)]
        return ["--data.init_args.root", str(root / "train"), *split]
    if config.name == "imagefolder.yaml":  # its commented options, switched on from the command line
        idx = ["--data.init_args.index_dir", str(tmp_path / "idx"), "--data.init_args.entropy_index", "true"]
        return ["--data.init_args.root", str(image_folder), *idx]
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
            *([] if "SegmentationDataModule" in config.read_text() else ["--data.init_args.image_size", "32"]),
            *(["--data.init_args.image_size", "96"] if "DetectionDataModule" in config.read_text() else []),
            "--data.init_args.num_workers",
            "0",
            "--trainer.fast_dev_run",
            "true",
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "1",
            "--model.image_arch" if "ImageTextDataModule" in config.read_text() else "--model.arch",
            "lraspp_mobilenet_v3_large"
            if "SegmentationDataModule" in config.read_text()
            else "ssdlite320_mobilenet_v3_large"
            if "DetectionDataModule" in config.read_text()
            else "resnet18",
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    if "ImageTextDataModule" not in config.read_text():  # a contrastive model has no classes
        assert cli.model.hparams["num_classes"] == 3  # linked from the DataModule
    assert cli.trainer.state.finished
    if config.name == "imagefolder.yaml":  # prepare_data built the entropy index; the train set decodes with it
        assert cli.datamodule.train_dataset.entropy_indexes is not None


def test_demo_data_is_generated_once(tmp_path: Path) -> None:
    root = ensure_demo_data(str(tmp_path / "demo"), num_classes=2, per_class=2, processes=1)
    assert len(list(root.glob("*/*.jpg"))) == 4 and (root / ".complete").exists()
    first = next(root.glob("*/*.jpg"))
    mtime = first.stat().st_mtime_ns
    ensure_demo_data(str(root), num_classes=2, per_class=2, processes=1)
    assert first.stat().st_mtime_ns == mtime


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_demo_measures_both_loaders_then_trains_from_any_directory(tmp_path: Path) -> None:
    """`cd /tmp && fastdata demo`: shipped config, comparison printed first and last, small CPU model, quiet."""
    elsewhere = tmp_path / "anywhere"
    elsewhere.mkdir()
    fastdata = Path(sys.executable).with_name("fastdata")
    args = ["demo", "--num-classes", "2", "--per-class", "40", "--seconds", "0.5", "--trainer.max_steps", "3"]
    args += ["--trainer.accelerator", "cpu"]
    out = subprocess.run([str(fastdata), *args], cwd=elsewhere, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list((elsewhere / "data" / "demo").glob("*/*.jpg"))) == 80  # relative to where it was run
    lines = out.stdout.strip().splitlines()
    baseline_line, ours_line = lines[-2], lines[-1]  # the comparison again, as the last lines
    assert "torchvision ImageFolder + DataLoader" in baseline_line and "ImageFolderDataModule" in ours_line
    baseline = float(re.findall(r"([\d.]+) images/s", baseline_line)[0])
    ours, ratio = (float(x) for x in re.findall(r"([\d.]+) images/s\s+\(([\d.]+)x\)", ours_line)[0])
    # Rates are printed to the unit and the ratio to 0.1, from the unrounded rates: allow both roundings.
    low, high = (ours - 0.5) / (baseline + 0.5), (ours + 0.5) / (baseline - 0.5)
    assert baseline > 0 and ours > 0 and low - 0.05 <= ratio <= high + 0.05, (baseline, ours, ratio)
    assert out.stdout.count(ours_line) == 2  # printed once before training, once at the end
    assert "images/s per rank over 3 steps" in out.stdout + out.stderr
    assert f"trains a {DEMO_CPU_ARCH}" in out.stdout
    for noise in ("set_vital", "LeafSpec", "Traceback"):
        assert noise not in out.stderr, out.stderr[-3000:]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["data"]  # no lightning_logs/ or config left behind


def test_every_shipped_config_tells_one_callback_story() -> None:
    """The README and the guides train with FastDataCallback: so does every shipped config (not a mix of callbacks)."""
    for path in CONFIGS:
        callbacks = (yaml.safe_load(path.read_text()).get("trainer") or {}).get("callbacks") or []
        ours = [c["class_path"] for c in callbacks if c["class_path"].startswith("lightning_fastdata.")]
        assert ours == ["lightning_fastdata.FastDataCallback"], (path.name, ours)


def test_the_repositorys_configs_folder_is_the_packages_one_set_of_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """``configs/`` beside ``notebooks/`` (the layout users look for) is the package's folder, not a copy to drift."""
    top = Path(__file__).resolve().parents[1]
    assert (top / "configs").is_symlink() and (top / "configs").resolve() == CONFIG_DIR.resolve()
    assert sorted(p.name for p in (top / "configs").glob("*.yaml")) == [p.name for p in CONFIGS]
    monkeypatch.chdir(top)
    assert find_config("configs/imagefolder.yaml").resolve() == (CONFIG_DIR / "imagefolder.yaml").resolve()


def test_config_names_resolve_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_config("imagefolder") == CONFIG_DIR / "imagefolder.yaml"
    assert find_config("hdf5.yaml") == CONFIG_DIR / "hdf5.yaml"
    (tmp_path / "imagefolder").write_text("trainer: {}\n")  # a file of the user's wins over a shipped name
    assert find_config("imagefolder") == Path("imagefolder")
    with pytest.raises(ConfigNotFoundError, match="callback_resume, captions, demo, detection, hdf5"):
        find_config("nope")
    with pytest.raises(ConfigNotFoundError):
        find_config("some/dir/demo.yaml")  # a path that does not exist is not silently a shipped config
    with pytest.raises(SystemExit, match="config 'nope' is not a file"):
        main(["fit", "--config=nope"])


def test_fastdata_config_lists_and_prints_the_shipped_configs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["config"])
    listed = capsys.readouterr().out
    assert all(f"{name} " in listed for name in ("demo", "imagefolder", "hdf5", "cache", "callback_resume"))
    rows = [line for line in listed.splitlines() if line and not line.startswith("(")]
    assert len(rows) == len(CONFIGS) and all(len(r) <= 100 and r.endswith(".") for r in rows), rows  # whole sentences
    main(["config", "hdf5"])
    assert capsys.readouterr().out == (CONFIG_DIR / "hdf5.yaml").read_text()


def test_cli_shows_our_validation_message_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "demo", "--data.init_args.root", str(missing), "--trainer.accelerator", "cpu"])
    err = str(exit_info.value.code)  # sys.exit(message): printed alone, exit status 1
    assert err.startswith(f"fastdata fit: error: Image folder '{missing}' does not exist"), err[-2000:]
    assert "Union" not in err and "Given value" not in err and "Traceback" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # an impossible argument: also ours, also alone
        main(["fit", "--config", "demo", "--data.init_args.batch_size", "0", "--trainer.accelerator", "cpu"])
    assert str(exit_info.value.code).startswith("fastdata fit: error: batch_size")


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only our validation's errors become one line: any other exception (a bug) propagates as it is."""
    import lightning_fastdata.cli as cli

    def broken(args: object, rest: object) -> None:
        raise ValueError("a bug, not a user's mistake")

    monkeypatch.setattr(cli, "_config", broken)
    with pytest.raises(ValueError, match="a bug"):
        main(["config"])


def test_fastdata_convert_shards_writes_tar_or_parquet_shards_of_about_the_size_given(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import tarfile

    import pyarrow.parquet as pq

    main(["convert", "shards", "--src", str(image_folder), "--dst", str(tmp_path / "s"), "--shard-size", "20kB"])
    shards = sorted((tmp_path / "s").glob("shard-*.tar"))
    assert len(shards) > 2 and f"wrote {len(shards)} tar shard(s)" in capsys.readouterr().out
    assert sum(len(tarfile.open(p).getnames()) for p in shards) == 2 * 39
    assert json.loads((tmp_path / "s" / "classes.json").read_text()) == ["class_000", "class_001", "class_002"]
    main(["convert", "shards", "--src", str(image_folder), "--dst", str(tmp_path / "p"), "--format", "parquet",
          "--shard-size", "20kB", "--rows-per-group", "4"])  # fmt: skip
    files = sorted((tmp_path / "p").glob("shard-*.parquet"))
    assert len(files) > 2 and f"wrote {len(files)} parquet shard(s)" in capsys.readouterr().out
    tables = [pq.read_table(p) for p in files]
    assert sum(t.num_rows for t in tables) == 39 and pq.ParquetFile(files[0]).metadata.row_group(0).num_rows == 4
    meta = json.loads(tables[0].schema.metadata[b"huggingface"])["info"]["features"]
    assert meta["label"]["names"] == ["class_000", "class_001", "class_002"]
    with pytest.raises(SystemExit):
        main(["convert", "shards", "--src", str(image_folder), "--dst", str(tmp_path / "t"), "--shard-size", "big"])
    assert "'big' is not a size" in capsys.readouterr().err


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


def _fit(args: list[str], cwd: Path, record: Path) -> tuple[int, str]:
    """``fastdata ARGS`` (``python -m lightning_fastdata.cli``) in a fresh process forked from the import server."""
    env = {"FASTDATA_RECORD": str(record)}
    return SERVER.command(args, cwd, record.with_suffix(".log"), env, module="lightning_fastdata.cli")


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_documented_resume_command_continues_at_the_step_and_sample(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: the same command with --ckpt_path last resumes (a second run, a new logger version)."""
    config = CONFIG_DIR / "callback_resume.yaml"
    common = ["fit", "--config", str(config), "--data.init_args.root", str(image_folder)]
    common += ["--data.init_args.image_size", "16", "--data.init_args.batch_size", "4", "--data.init_args.num_workers"]
    common += ["0", "--data.init_args.val_fraction", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1"]
    common += ["--trainer.enable_progress_bar", "false", "--trainer.callbacks+=step_recorder.StepRecorder"]
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    # the uninterrupted reference runs in this process (same command through run_cli): only the runs under test
    # pay for a process start
    with monkeypatch.context() as m:
        m.setenv("FASTDATA_RECORD", str(tmp_path / "ref.jsonl"))
        m.syspath_prepend(str(Path(__file__).with_name("helpers")))
        m.chdir(tmp_path / "ref")
        run_cli([*common, "--trainer.max_steps", "10"])
    code, nothing = _fit(
        [*common, "--trainer.max_steps", "5", "--ckpt_path", "last"], tmp_path / "run", tmp_path / "a.jsonl"
    )
    assert code == 0, nothing[-3000:]
    assert "no last checkpoint" in nothing  # a first run with nothing to resume says so
    code, resumed = _fit(
        [*common, "--trainer.max_steps", "10", "--ckpt_path", "last"], tmp_path / "run", tmp_path / "b.jsonl"
    )
    assert code == 0, resumed[-3000:]
    assert "checkpoints/resume/last.ckpt" in resumed
    lines = [json.loads(x) for x in (tmp_path / "ref.jsonl").read_text().splitlines()]
    first = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    second = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first] == [0, 1, 2, 3, 4] and [r["step"] for r in second] == [5, 6, 7, 8, 9]
    assert first + second == lines  # same epochs, steps, batch indices and samples as the uninterrupted run
    assert all(r["epoch"] == 0 for r in second)  # 39 images / 4: all 10 steps are in epoch 0


@pytest.mark.slow
def test_commands_do_not_warn_about_lightningcli_args() -> None:
    """`fastdata fit --help` is LightningCLI reading the command line: no "args is meant for Python" warning."""
    fastdata = Path(sys.executable).with_name("fastdata")
    out = subprocess.run([str(fastdata), "fit", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--data" in out.stdout and "--ckpt_path" in out.stdout
    assert "args" not in out.stderr, out.stderr[-2000:]


def test_fastdata_help_lists_every_command_and_each_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    listed = capsys.readouterr().out
    for command in ("fit", "demo", "config", "make-data", "convert", "bench", "doctor"):
        assert re.search(rf"^\s+{command}\b", listed, re.M), command  # argparse lists each subcommand on its line
    for command in (["make-data"], ["demo"], ["config"], ["convert"], ["bench"], ["doctor"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert f"fastdata {command[0]}" in out and ("example" in out or "fastdata bench" in out), out[-500:]


def test_help_and_the_argparse_commands_load_no_torch() -> None:
    """`fastdata --help` and every subcommand's own parser are built without torch or Lightning (they answered in
    ~8 s on this VM when the command imported them first; now in well under a second)."""
    code = (
        "import sys\n"
        "from lightning_fastdata.cli import build_parser, main\n"
        "parser = build_parser()\n"
        "for argv in (['--help'], ['doctor', '--help'], ['convert', 'hdf5', '--help'], ['demo', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as stop:\n"
        "        assert stop.code == 0, (argv, stop.code)\n"
        "main(['config'])\n"
        "print(sorted(m for m in ('torch', 'lightning', 'torchvision') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "batch size per training process" in out.stdout  # help text on every doctor option


def test_a_typo_in_a_config_or_an_option_names_it_and_the_closest_valid_key(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line with the closest valid key, exit status 2 (jsonargparse printed ~62 lines of usage)."""
    config = tmp_path / "typo.yaml"
    config.write_text(
        "trainer:\n  max_epochs: 1\ndata:\n  class_path: lightning_fastdata.ImageFolderDataModule\n"
        f"  init_args:\n    root: {image_folder}\n    batchsize: 4\n"
    )
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(config)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert "'batchsize' is not an argument of lightning_fastdata.ImageFolderDataModule" in err
    assert "did you mean 'batch_size'" in err
    config.write_text(config.read_text().replace("batchsize", "batch_size"))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(config), "--trainer.max_epochz", "2"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "did you mean 'trainer.max_epochs'" in err and len(err.splitlines()) == 1


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`fastdata config | head -1`: no BrokenPipeError traceback (`true` reads nothing: the pipe is always gone)."""
    fastdata = Path(sys.executable).with_name("fastdata")
    for reader in ("head -1", "true"):
        out = subprocess.run(f"'{fastdata}' config | {reader}", shell=True, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fit_then_validate_test_and_predict_from_the_checkpoint(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped config through LightningCLI's four subcommands; ``fastdata predict`` writes the table itself."""
    import csv

    monkeypatch.chdir(tmp_path)
    data = ["--config", "imagefolder", "--data.init_args.root", str(image_folder), "--data.init_args.image_size", "16"]
    data += ["--data.init_args.batch_size", "8", "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu"]
    data += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false"]
    run_cli(["fit", *data, "--trainer.max_steps", "2"])
    ckpt = str(next((tmp_path / "run").rglob("*.ckpt")))
    from lightning_fastdata import ImageClassifier

    kept = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu")  # the class names travel with the weights
    assert kept.class_names == ["class_000", "class_001", "class_002"]
    with pytest.raises(ValueError, match="class_names has 2 names for num_classes=3"):
        ImageClassifier(num_classes=3, class_names=["a", "b"])
    validated = run_cli(["validate", *data, "--ckpt_path", ckpt])
    assert {"val_loss", "val_acc"} <= set(validated.trainer.callback_metrics)
    tested = run_cli(["test", *data, "--data.init_args.test_root", str(image_folder), "--ckpt_path", ckpt])
    assert {"test_loss", "test_acc"} <= set(tested.trainer.callback_metrics)
    run_cli(["predict", *data, "--data.init_args.predict_root", str(image_folder), "--ckpt_path", ckpt])
    with open(tmp_path / "run" / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 1 + 39 and rows[1][0].startswith(str(image_folder)) and rows[1][1].startswith("class_")


@pytest.mark.timeout(300)
@pytest.mark.slow  # over 7 s on the 2-core VM (14 s, 10 s in session 23): the full run's
def test_a_label_table_from_the_command_line_links_the_models_classes_and_kind(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--data.init_args.labels``/``multi_label`` reach ``ImageClassifier`` through the links (its ``num_classes``,
    ``class_names`` and ``multi_label``), and ``fastdata convert hdf5 --labels --multi-label`` writes the rows."""
    import csv
    import shutil

    import h5py

    monkeypatch.chdir(tmp_path)
    flat = tmp_path / "images"
    flat.mkdir()
    rows = [["id", "tags"]]
    for k, image in enumerate(sorted(image_folder.rglob("*.jpg"))):
        shutil.copy(image, flat / f"{k:02d}.jpg")
        rows.append([f"{k:02d}", f"{image.parent.name} {'odd' if k % 2 else 'even'}"])
    with open(tmp_path / "tags.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    data = ["--config", "imagefolder", "--data.init_args.root", str(flat), "--data.init_args.labels", "tags.csv"]
    data += ["--data.init_args.multi_label", "true", "--data.init_args.image_size", "16"]
    data += ["--data.init_args.batch_size", "8", "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu"]
    data += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false"]
    cli = run_cli(["fit", *data, "--trainer.max_epochs", "1"])
    assert cli.model.hparams["multi_label"] is True and cli.model.hparams["num_classes"] == 5
    assert cli.model.class_names == ["class_000", "class_001", "class_002", "even", "odd"]
    assert {"val_loss", "val_map", "val_f1"} <= set(cli.trainer.callback_metrics)
    main(["convert", "hdf5", "--src", str(flat), "--dst", "tags.h5", "--labels", "tags.csv", "--multi-label",
          "--processes", "1"])  # fmt: skip
    with h5py.File(tmp_path / "tags.h5") as f:
        assert f["labels"].shape == (39, 5) and f["labels"].dtype == "uint8" and int(f["labels"][()].sum()) == 78


def test_make_data_writes_segmentation_scenes_in_vocs_layout_into_a_new_folder_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES

    main(["make-data", str(tmp_path / "scenes"), "--task", "segmentation", "--count", "6"])
    ds = mask_folder(tmp_path / "scenes", "train", num_classes=len(SEGMENTATION_CLASSES), crop_size=64)
    images, masks = ds.__getitems__([0, 1])
    assert len(ds) == 5 and images.shape == (2, 3, 64, 64) and masks.shape == (2, 64, 64)
    assert "wrote 6 scenes" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="exists and is not empty; choose a new or empty folder"):
        main(["make-data", str(tmp_path / "scenes"), "--task", "segmentation"])


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_segmentation_config_fits_validates_tests_and_predicts_masks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config segmentation``: ImageSegmenter with the DataModule's classes and ignore index linked; the saved
    checkpoint validates, tests (``val_miou``, ``test_miou``) and predicts: one PNG mask per image and the table."""
    from PIL import Image

    from lightning_fastdata.segmentation.demos import make_segmentation_folder

    monkeypatch.chdir(tmp_path)
    root = make_segmentation_folder(tmp_path / "scenes", count=10, size=(70, 50), seed=2)
    data = ["--config", "segmentation", "--data.init_args.root", str(root), "--data.init_args.base_size", "40"]
    data += ["--data.init_args.crop_size", "32", "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu"]
    data += ["--data.init_args.ignore_index", "250", "--data.init_args.label_map"]
    data += ["{0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 255: 250}"]
    data += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false"]
    data += ["--data.init_args.batch_size", "4", "--trainer.logger", "false"]
    cli = run_cli(["fit", *data, "--trainer.max_epochs", "1"])
    assert cli.model.hparams["num_classes"] == 6 and cli.model.class_names[1] == "red"
    assert cli.model.ignore_index == 250 and {"val_loss", "val_miou"} <= set(cli.trainer.callback_metrics)
    ckpt = str(next((tmp_path / "run").rglob("last.ckpt")))
    tested = run_cli(["test", *data, "--data.init_args.test_split", "val", "--ckpt_path", ckpt])
    assert {"test_loss", "test_pixel_acc", "test_miou"} <= set(tested.trainer.callback_metrics)
    run_cli(["predict", *data, "--data.init_args.predict_root", str(root / "JPEGImages"), "--ckpt_path", ckpt])
    table = (tmp_path / "run" / "masks" / "predictions.csv").read_text().splitlines()
    assert len(table) == 11 and table[1] == f"{root / 'JPEGImages' / 'scene_000000.jpg'},scene_000000.png"
    with Image.open(tmp_path / "run" / "masks" / "scene_000000.png") as mask:
        with Image.open(root / "JPEGImages" / "scene_000000.jpg") as image:
            assert mask.size == image.size and mask.mode == "P"


@pytest.mark.timeout(300)
def test_the_detection_config_fits_and_tests_an_object_detector_on_made_scenes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fastdata make-data --task detection`` then ``--config detection``: ObjectDetector with the DataModule's
    classes linked trains on the scenes (every loss finite) and its checkpoint tests (``test_map`` in 0..1)."""
    monkeypatch.chdir(tmp_path)
    main(["make-data", str(tmp_path / "boxes"), "--task", "detection", "--count", "8"])
    assert "wrote 8 scenes and their boxes in COCO's layout" in capsys.readouterr().out
    data = ["--config", "detection", "--data.init_args.root", str(tmp_path / "boxes"), "--trainer.accelerator", "cpu"]
    data += ["--data.init_args.num_workers", "0", "--data.init_args.batch_size", "3", "--trainer.logger", "false"]
    data += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false"]
    data += ["--data.init_args.image_size", "96"]
    cli = run_cli(["fit", *data, "--trainer.max_epochs", "1"])
    assert type(cli.model).__name__ == "ObjectDetector" and cli.model.hparams["num_classes"] == 5
    assert cli.model.hparams["class_names"] == ["red", "green", "blue", "yellow", "magenta"]
    metrics = cli.trainer.callback_metrics
    assert math.isfinite(float(metrics["train_loss"])) and 0 <= float(metrics["val_map"]) <= 1
    ckpt = str(next((tmp_path / "run").rglob("last.ckpt")))
    tested = run_cli(["test", *data, "--data.init_args.test_split", "val2017", "--ckpt_path", ckpt])
    assert 0 <= float(tested.trainer.callback_metrics["test_map"]) <= 1
