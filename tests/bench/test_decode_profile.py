"""``python -m benchmarks.decode_profile`` at a tiny size: every stage timed, the shares of crop sizes sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(120)
def test_decode_profile_times_every_stage(tmp_path: Path) -> None:
    out_json = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "benchmarks.decode_profile", "--images", "8", "--json", str(out_json)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out_json.read_text())
    stages = result["ms_per_image"]
    assert "full decode (decode_jpeg)" in stages
    for size in (224, 112):  # the whole path, exact and default, at the output and at half of it
        assert {f"whole path at {size} px (exact=True)", f"whole path at {size} px (default)"} <= set(stages)
    assert "ROI decode at 1/8 of the crop's rows: its entropy-decoding floor" in stages
    assert all(ms > 0 for ms in stages.values())
    for q in result["psnr_vs_exact"].values():  # the default path is a close picture of the exact one
        assert 25 < q["mean_db"] < 99 and q["worst_db"] <= q["mean_db"] and 0 <= q["share_dct_scaled"] <= 1
    shares = list(result["crop_shares"].values())
    assert all(0 <= s <= 1 for s in shares) and shares == sorted(shares, reverse=True)
