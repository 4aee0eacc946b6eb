"""``python -m benchmarks.index_cost`` at a tiny size: each kind's build and crops timed, the JSON written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import index_cost


@pytest.mark.timeout(120)
def test_index_cost_times_the_build_and_both_crops_for_each_kind(tmp_path: Path) -> None:
    out_json = tmp_path / "cost.json"
    kinds = ["photo 500x375 q90", "photo 800x600 q90 4:4:4"]
    result = index_cost.main(
        ["--kinds", *kinds, "--files", "4", "--repeats", "1", "--scratch", str(tmp_path / "data"), "--json",
         str(out_json)]
    )  # fmt: skip
    assert json.loads(out_json.read_text()) == result and result["settings"]["files"] == 4
    assert [row["kind"] for row in result["kinds"]] == kinds
    for row in result["kinds"]:
        assert row["files"] == row["indexed_files"] == 4 and row["kb_per_file"] > 10  # photos: each gets an index
        ms = row["ms_per_file"]
        assert set(ms) == {"build", "crop", "crop_indexed"} and all(v > 0 for v in ms.values())
        assert row["build_vs_crop"] == pytest.approx(ms["build"] / ms["crop"], abs=1e-3)
