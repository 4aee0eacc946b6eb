"""The compiled decoder: which libjpeg-turbo it runs on, what a run without it says, and the fuzzer's harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fastdata._ext import native

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "scripts" / "fuzz_jpeg.py"
REPRODUCERS = ROOT / "tests" / "data" / "fuzz-reproducers"


def test_the_decoder_says_which_libjpeg_turbo_it_calls() -> None:
    """The checkout's build links the system's libjpeg-turbo (setup.sh installs its headers): the extension names
    that file, and the summary setup.sh and the doctor print says so."""
    assert native.roi_decode_available()
    path = native.libjpeg_path()
    assert path is not None and "libjpeg" in Path(path).name and Path(path).exists()
    assert native.decoder_summary() == f"yes: the system's libjpeg-turbo ({path})"


@pytest.mark.slow
def test_training_without_the_decoder_warns_once_with_the_cost_and_the_fix(image_folder: Path) -> None:
    """Without the compiled decoder (turned off here, as a failed build leaves it) a fit and a validate through two
    worker processes train on, and say once what it costs and how to fix it; with it, nothing is said."""
    code = f"""
import warnings, lightning as L, torch
from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.models import ImageClassifier
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    dm = ImageFolderDataModule({str(image_folder)!r}, image_size=32, batch_size=8, num_workers=2, val_fraction=0.2)
    model = ImageClassifier(num_classes=3, arch="resnet18")
    trainer = L.Trainer(max_steps=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, datamodule=dm)
    trainer.validate(model, datamodule=dm, verbose=False)
print("WARNINGS", [str(w.message) for w in caught if "compiled JPEG decoder" in str(w.message)])
print("STEPS", trainer.global_step)
"""
    for disabled in (True, False):
        env = dict(os.environ, FASTDATA_DISABLE_DECODER="1" if disabled else "0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        warned = next(line for line in out.stdout.splitlines() if line.startswith("WARNINGS"))
        assert "STEPS 2" in out.stdout
        if not disabled:
            assert warned == "WARNINGS []"
            continue
        messages = eval(warned[len("WARNINGS ") :])  # noqa: S307 - our own subprocess's list of strings
        assert len(messages) == 1, messages
        assert f"about {native.WITHOUT_DECODER_SPEED} of its speed" in messages[0]
        assert "pip install --force-reinstall --only-binary=lightning-fastdata" in messages[0]
        assert "FASTDATA_DISABLE_DECODER=1" in messages[0]


def test_the_doctor_line_names_the_missing_decoder_and_its_cost() -> None:
    from lightning_fastdata.diagnose import report

    assert native.WITHOUT_DECODER_SPEED in report._NO_DECODER and "binary wheel" in report._NO_DECODER


def _fuzz(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FUZZ), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_the_fuzzer_mutates_damaged_jpegs_and_indexes_into_every_call_and_survives(tmp_path: Path) -> None:
    """``scripts/fuzz_jpeg.py`` (what the release script runs under the sanitizers) on the installed extension
    for a fixed number of cases (a count, not a time: the same cases on a slow machine): the seed corpus written
    (the shipped libjpeg-turbo test images among them), cases through each of the extension's parsers, both clean
    results and refusals, and no crash."""
    so = native.jpegroi.__file__  # type: ignore[union-attr]
    seeds = tmp_path / "seeds"
    assert _fuzz("seeds", str(seeds)).returncode == 0
    names = {p.name for p in seeds.glob("*.jpg")}
    assert {"testorig.jpg", "testimgint.jpg", "testimgari.jpg"} <= names and len(names) == 51
    out = _fuzz(
        "run", "--ext", so, "--seeds", str(seeds), "--work", str(tmp_path / "w"), "--cases", "1200", "--seconds", "300"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no crash" in out.stdout
    outcomes = json.loads(out.stdout[out.stdout.index("{") :])
    assert sum(outcomes.values()) == 1200 and "1200 cases" in out.stdout
    for op in ("header", "decode_crop", "entropy_index", "crop_jpeg"):
        assert outcomes.get(f"{op}: ok", 0) > 0, (op, outcomes)
    assert outcomes.get("decode_crop: OSError", 0) > 0 and outcomes.get("header: OSError", 0) > 0
    assert any(k.startswith("crop_jpeg: ") and not k.endswith(": ok") for k in outcomes)
    # the last case is left behind, in the form the release script keeps and replay reads
    case = tmp_path / "w" / "current"
    assert json.loads((case / "case.json").read_text())["op"] in ("header", "decode_crop", "entropy_index", "crop_jpeg")
    replayed = _fuzz("replay", "--ext", so, str(case))
    assert replayed.returncode == 0 and replayed.stdout.startswith(f"{case}: ")


def test_every_kept_fuzz_reproducer_is_refused_cleanly(tmp_path: Path) -> None:
    """Each case the fuzzer ever crashed the extension with (kept in tests/data/fuzz-reproducers/ with its fix)
    runs in a fresh process and ends in a Python exception or a result, never a crash; and a hand-made damaged
    case (a truncated file with a wrong-size index) shows the replay path itself works."""
    sys.path.insert(0, str(FUZZ.parent))
    try:
        import fuzz_jpeg
    finally:
        sys.path.pop(0)
    corpus = ROOT / "tests" / "data" / "jpeg-corpus" / "testorig.jpg"
    made = tmp_path / "made"
    fuzz_jpeg.save_case(
        made, {"op": "crop_jpeg", "args": [0, 2, 0, 2]}, corpus.read_bytes()[:3000], b"FDX3" + bytes(40)
    )
    cases = [made, *sorted(p for p in REPRODUCERS.glob("*") if p.is_dir())]
    out = _fuzz("replay", "--ext", native.jpegroi.__file__, *map(str, cases))  # type: ignore[union-attr]
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(out.stdout.splitlines()) == len(cases)
