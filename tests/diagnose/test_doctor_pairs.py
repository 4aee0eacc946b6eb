"""``fastdata doctor`` on a folder of image-caption tar shards: the pairs, the broken keys by shard, the module's
rate, and a config of the captions recipe on them; nothing written beside the shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.captions import write_shards

from lightning_fastdata.diagnose.main import main


@pytest.mark.timeout(180)
def test_the_doctor_counts_the_pairs_and_the_keys_img2dataset_left_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """30 keys in 4 shards, key 3 without its image and key 5 without its caption (both in the first shard): 28
    pairs, 2 skipped, named by shard; the config written trains on the shards with the validation shards beside."""
    write_shards(tmp_path / "data" / "train", 30, 8)
    write_shards(tmp_path / "data" / "val", 9, 8)
    before = sorted(p.name for p in (tmp_path / "data" / "train").iterdir())
    cfg = tmp_path / "pairs.yaml"
    args = ["--seconds", "2", "--batch-size", "4", "--image-size", "32", "--write-config", str(cfg)]
    report = main([str(tmp_path / "data" / "train"), *args])
    out = capsys.readouterr().out
    assert (report.shards, report.pairs, report.skipped) == (4, 28, 2)  # type: ignore[union-attr]
    assert "pairs: 28" in out and "skipped: 2 key(s)" in out and "00000.tar: 2" in out
    assert report.images_per_s > 0  # type: ignore[union-attr]
    data = yaml.safe_load(cfg.read_text())["data"]
    assert data["class_path"] == "lightning_fastdata.ImageTextDataModule"
    assert data["init_args"]["root"] == str(tmp_path / "data" / "train")
    assert data["init_args"]["val_root"] == str(tmp_path / "data" / "val")
    assert (data["init_args"]["batch_size"], data["init_args"]["image_size"]) == (4, 32)
    assert sorted(p.name for p in (tmp_path / "data" / "train").iterdir()) == before
    from lightning_fastdata import ImageTextDataModule

    dm = ImageTextDataModule(**{**data["init_args"], "text_transform": None, "index_dir": str(tmp_path / "i")})
    dm.setup("fit")
    assert len(dm.train_dataset) == 28 and dm.skipped == {"train": 2, "val": 2}  # the same broken keys 3 and 5
