from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fastdata import convert_folder_to_hdf5, scan_image_folder
from lightning_fastdata.demos import make_image_folder


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("kind", "workers"), [("folder", 0), ("folder", 2), ("hdf5", 2), ("cache", 2)])
def test_two_process_ddp_ranks_get_disjoint_halves(tmp_path: Path, kind: str, workers: int) -> None:
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=10, size=(32, 24))
    source = root if kind != "hdf5" else convert_folder_to_hdf5(root, tmp_path / "d.h5", processes=1, progress=False)
    script = Path(__file__).with_name("helpers") / "ddp_fit.py"
    out = subprocess.run(
        [sys.executable, str(script), str(source), str(tmp_path), str(workers), kind],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    if kind == "cache":  # prepare_data ran on local rank 0 only; rank 1 waited, then opened the same cache
        assert out.stdout.count("building the tensor cache") == 1, out.stdout
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    a, b = (set(r["indices"]) for r in ranks)
    assert len(a) == len(b) == 10 and not a & b and a | b == set(range(20))
    labels = scan_image_folder(str(root)).labels
    for r in ranks:  # what the model received is exactly this rank's shard
        assert sorted(r["labels"]) == sorted(int(labels[i]) for i in r["indices"])
