"""The benchmark harness runs end to end from one command and reports what it measured (no speed asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_fastdata.bench.loaders import main


def test_bench_folder_suite_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "latest.json"
    result = main(
        [
            "--root", str(tmp_path / "bench"), "--num-classes", "2", "--per-class", "12", "--suites", "folder",
            "--workers", "0", "2", "--batch-size", "4", "--image-size", "32", "--repeats", "1",
            "--min-seconds", "0", "--json", str(out),
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "| baseline (torchvision ImageFolder) | 2 |" in printed and "| ImageFolderDataModule | 2 |" in printed
    saved = json.loads(out.read_text())
    rows = saved["suites"]["folder"]
    assert [(r["loader"], r["num_workers"]) for r in rows][:2] == [
        ("baseline (torchvision ImageFolder)", 0),
        ("ImageFolderDataModule", 0),
    ]
    assert len(rows) == 6 and all(r["images_per_s"] > 0 for r in rows)
    assert rows[0]["vs_baseline"] == 1.0 and result["data"]["files"] == 24
