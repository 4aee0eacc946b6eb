"""Image-caption pairs: every caption arrives with its own image, from img2dataset-style shards and Parquet files.

The images are solid colours that encode their ids (40 levels apart per channel: a JPEG, a crop and a resize keep
them), and their captions name those ids: a caption paired with another sample's image fails.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch
from helpers.captions import caption_id, id_of, jpeg, paired_ids, write_shards
from helpers.restored import rest_and_restored

from benchmarks.s3_server import LocalS3, upload_folder
from lightning_fastdata.captions.datamodule import ImageTextDataModule


@pytest.mark.timeout(180)
def test_every_caption_arrives_with_its_own_image_through_workers_and_a_resume(tmp_path: Path) -> None:
    """30 pairs in 4 shards, two of them broken (no image, no caption: skipped and counted); every batch's captions
    name their images, every pair once an epoch, 224 px squares; the same batches with 0 and 2 workers; a loader
    restored mid-epoch gives the rest."""
    write_shards(tmp_path / "train", 30, 8)

    def module(**kw: object) -> ImageTextDataModule:
        args: dict = dict(batch_size=4, num_workers=2, seed=3, index_dir=str(tmp_path / "index"), image_size=64)
        return ImageTextDataModule(str(tmp_path / "train"), **{**args, **kw})

    dm = module()
    dm.setup("fit")
    assert dm.skipped == {"train": 2}
    batches = list(dm.train_dataloader())
    assert all(images.shape[1:] == (3, 64, 64) and isinstance(texts, list) for images, texts in batches)
    assert sorted(paired_ids(batches)) == [k for k in range(30) if k not in (3, 5)]
    serial = module(num_workers=0)
    serial.setup("fit")
    for (a, ta), (b, tb) in zip(batches, serial.train_dataloader(), strict=True):
        assert torch.equal(a, b) and ta == tb
    rest, restored = rest_and_restored(dm.train_dataloader(), module)
    for (a, ta), (b, tb) in zip(rest, restored, strict=True):
        assert torch.equal(a, b) and ta == tb


class Tokens:
    """A stand-in tokenizer: the caption's image id and caption number, in a dict (as the hubs' tokenizers return)."""

    def __call__(self, text: str) -> dict[str, torch.Tensor]:
        number = int(text.split("caption ")[1]) if "caption " in text else -1
        return {"input_ids": torch.tensor([caption_id(text), number]), "mask": torch.ones(2, dtype=torch.int64)}


@pytest.mark.timeout(180)
def test_several_captions_are_drawn_by_key_and_tokenized_in_the_workers(tmp_path: Path) -> None:
    """Three captions per image in ``key.json``: each sample draws one from its key (all three over epochs, the
    same again for the same epoch), tokenized in the workers and stacked per key; validation takes the first."""
    write_shards(tmp_path / "train", 12, 6, json_captions=True)
    dm = ImageTextDataModule(str(tmp_path / "train"), val_root=str(tmp_path / "train"), caption_field="caption",
                             text_transform=Tokens(), batch_size=5, num_workers=2, image_size=32,
                             index_dir=str(tmp_path / "index"))  # fmt: skip
    dm.setup("fit")
    images, tokens = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert images.dtype == torch.float32 and tokens["input_ids"].shape == (5, 2) and tokens["mask"].shape == (5, 2)
    seen: dict[int, set[int]] = {}
    for epoch in range(4):
        for k in range(len(dm.train_dataset)):
            image, token = dm.train_dataset[(epoch, k)]
            assert id_of(image) == int(token["input_ids"][0])
            seen.setdefault(k, set()).add(int(token["input_ids"][1]))
        assert [dm.train_dataset[(epoch, k)][1]["input_ids"].tolist() for k in range(3)] == [
            dm.train_dataset[(epoch, k)][1]["input_ids"].tolist() for k in range(3)
        ]
    assert all(numbers <= {0, 1, 2} for numbers in seen.values())
    assert sum(len(numbers) > 1 for numbers in seen.values()) >= 5  # another caption in another epoch
    val = [t for _, texts in dm.val_dataloader() for t in texts["input_ids"].tolist()]
    assert len(val) == 11 and all(number == 0 for _, number in val)  # evaluation: the first caption
    assert dm.skipped == {"train": 1, "val": 1}  # key 3 has no image (key 5 lacks only its .txt)


@pytest.mark.timeout(120)
def test_a_parquet_text_column_pairs_as_the_shards_do(tmp_path: Path) -> None:
    """The hubs' layout: an ``image`` struct column and a ``caption`` string column (or a list of captions), in two
    files of row groups of 4: every caption with its own image, each pair once an epoch; a null caption named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    (tmp_path / "pq").mkdir()
    for part, ids in enumerate((range(0, 10), range(10, 17))):
        images = [{"bytes": jpeg(k, (70 + k, 90)), "path": f"{k}.jpg"} for k in ids]
        table = pa.table({"image": pa.array(images, kind), "caption": [f"a photo of image {k}" for k in ids],
                          "captions": [[f"image {k}, caption {j}" for j in range(2)] for k in ids]})  # fmt: skip
        pq.write_table(table, tmp_path / "pq" / f"part-{part}.parquet", row_group_size=4)

    def pairs(column: str) -> list[tuple[int, int]]:
        dm = ImageTextDataModule(str(tmp_path / "pq"), text_column=column, batch_size=3, num_workers=2, image_size=48,
                                 index_dir=str(tmp_path / "index"))  # fmt: skip
        dm.setup("fit")
        return [(id_of(image), caption_id(text)) for images, texts in dm.train_dataloader()
                for image, text in zip(images, texts)]  # fmt: skip

    for column in ("caption", "captions"):
        got = pairs(column)
        assert all(a == b for a, b in got) and sorted(b for _, b in got) == list(range(17)), column
    table = pq.read_table(tmp_path / "pq" / "part-1.parquet")
    nulls = table.set_column(1, "caption", pa.array([None] * len(table), pa.string()))
    pq.write_table(nulls, tmp_path / "pq" / "part-1.parquet", row_group_size=4)
    with pytest.raises(Exception, match=r"part-1\.parquet:row \d+ has no caption"):
        pairs("caption")


@pytest.mark.timeout(120)
def test_a_mix_of_pair_sources_draws_each_by_its_weight_every_caption_with_its_image(tmp_path: Path) -> None:
    """``MixedDataModule`` of two shard sets (LAION's with CC12M's, say), weights 1:3, an epoch of 80 draws: both
    sources drawn about so, every caption with its image, the texts batched as each source gives them."""
    from lightning_fastdata import MixedDataModule

    write_shards(tmp_path / "a", 20, 10)
    second = tmp_path / "b"
    second.mkdir()
    with tarfile.open(second / "00000.tar", "w") as tf:  # ids 40-59
        for k in range(40, 60):
            for ext, data in (("jpg", jpeg(k, (80, 64))), ("txt", f"a photo of image {k}".encode())):
                info = tarfile.TarInfo(f"{k:09d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    sources = [ImageTextDataModule(str(tmp_path / name), image_size=48, index_dir=str(tmp_path / "i"))
               for name in ("a", "b")]  # fmt: skip
    mix = MixedDataModule(sources, weights=[1, 3], batch_size=8, num_workers=2, epoch_size=80, seed=1)
    mix.setup("fit")
    drawn = paired_ids(list(mix.train_dataloader()))
    assert len(drawn) == 80
    second_share = sum(k >= 40 for k in drawn) / 80
    assert 0.6 < second_share < 0.9  # 3 of 4 drawn from the second, by its weight


@pytest.mark.timeout(120)
def test_a_table_beside_a_folder_gives_each_image_its_captions(tmp_path: Path) -> None:
    """``captions_table="captions.csv"``: a folder of images and ``file,caption`` rows (two per image, COCO
    Captions' way), each image with its captions drawn by key; a Parquet table likewise; a named image that is
    missing, and a table without the columns, named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    rows = []
    for k in range(10):
        name = f"sub/{k}.jpg" if k % 3 else f"{k}.jpg"
        (folder / name).write_bytes(jpeg(k, (90, 70)))
        rows += [(name, f"image {k}, caption {j}") for j in range(2)]
    (folder / "captions.csv").write_text("file,caption\n" + "".join(f'{f},"{c}"\n' for f, c in rows))
    pq.write_table(pa.table({"file": [f for f, _ in rows], "caption": [c for _, c in rows]}), folder / "c.parquet")

    for table in ("captions.csv", "c.parquet"):
        dm = ImageTextDataModule(str(folder), captions_table=table, text_transform=Tokens(), batch_size=4,
                                 num_workers=2, image_size=32)  # fmt: skip
        dm.setup("fit")
        seen = [(id_of(image), int(token[0]), int(token[1])) for images, tokens in dm.train_dataloader()
                for image, token in zip(images, tokens["input_ids"])]  # fmt: skip
        assert sorted(a for a, _, _ in seen) == list(range(10)) and all(a == b for a, b, _ in seen)
        assert {n for _, _, n in seen} <= {0, 1}
    (folder / "bad.csv").write_text("file,caption\nmissing.jpg,a caption\n")
    with pytest.raises(FileNotFoundError, match=r"bad\.csv names 1 image\(s\) .* 'missing\.jpg'"):
        ImageTextDataModule(str(folder), captions_table="bad.csv").setup("fit")
    (folder / "cols.csv").write_text("path,text\n0.jpg,x\n")
    with pytest.raises(Exception, match=r"cols\.csv has no column 'file'"):
        ImageTextDataModule(str(folder), captions_table="cols.csv").setup("fit")


@pytest.mark.slow  # ~9 s: two CLI runs and three loaders
@pytest.mark.timeout(180)
def test_a_folder_and_its_table_converted_to_shards_and_parquet_give_the_folders_batches(tmp_path: Path) -> None:
    """``fastdata convert captions``: a folder with two captions an image in a table, as tar shards (every caption
    in ``key.json``) and as Parquet (a list column): ImageTextDataModule's batches from either are the folder's, bit
    for bit (the same pixels, the same caption drawn for each sample); nothing written into the folder."""
    import subprocess
    import sys

    folder = tmp_path / "photos"
    folder.mkdir()
    rows = []
    for k in range(14):
        (folder / f"{k}.jpg").write_bytes(jpeg(k, (90 + k, 70)))
        rows += [(f"{k}.jpg", f"image {k}, caption {j}") for j in range(2)]
    (folder / "captions.csv").write_text("file,caption\n" + "".join(f'{f},"{c}"\n' for f, c in rows))
    before = sorted(p.name for p in folder.iterdir())
    for fmt in ("tar", "parquet"):
        cmd = [sys.executable, "-m", "lightning_fastdata.cli", "convert", "captions", "--src", str(folder), "--table",
               "captions.csv", "--dst", str(tmp_path / fmt), "--format", fmt, "--shard-size", "4kB"]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "ImageTextDataModule" in out.stdout, out.stderr[-2000:]
    assert len(list((tmp_path / "tar").glob("shard-*.tar"))) > 1 and sorted(p.name for p in folder.iterdir()) == before

    def batches(root: Path, **kw: object) -> list[tuple[list[int], list[str]]]:
        dm = ImageTextDataModule(str(root), batch_size=4, num_workers=2, image_size=32, seed=5,
                                 index_dir=str(tmp_path / "index"), **kw)  # type: ignore[arg-type]  # fmt: skip
        dm.setup("fit")
        return [(images.flatten().tolist(), texts) for images, texts in dm.train_dataloader()]

    reference = batches(folder, captions_table="captions.csv")
    assert {caption_id(t) for _, texts in reference for t in texts} == set(range(14))
    assert batches(tmp_path / "tar", caption_field="caption") == reference
    assert batches(tmp_path / "parquet", shuffle_buffer=None) == reference


@pytest.mark.timeout(180)
def test_shards_in_a_bucket_are_read_in_runs_every_caption_with_its_image(tmp_path: Path, s3: LocalS3) -> None:
    """Caption shards on the local S3 server: read in runs of members (one request a run, the next batches' runs
    requested ahead) and shuffled in windows of them; every caption with its own image, every pair once an epoch,
    through 2 workers; a loader restored mid-epoch gives the rest; a full shuffle (``shuffle_buffer=None``) reads the
    same pairs a request each."""
    write_shards(tmp_path / "train", 40, 8)
    url = s3.url("caption-shards")
    upload_folder(tmp_path / "train", url, s3.storage_options())

    def module(**kw: object) -> ImageTextDataModule:
        args: dict = dict(batch_size=4, num_workers=2, seed=3, index_dir=str(tmp_path / "index"), image_size=32,
                          storage_options=s3.storage_options(), shuffle_buffer=16)  # fmt: skip
        return ImageTextDataModule(url, **{**args, **kw})

    dm = module()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert dm.train_dataset.block_reads and loader.sampler.windows is not None
    assert loader.dataset.lookahead is not None  # the next batches' runs requested while one decodes
    batches = list(loader)
    assert sorted(paired_ids(batches)) == [k for k in range(40) if k not in (3, 5)]
    rest, restored = rest_and_restored(loader, module)
    for (a, ta), (b, tb) in zip(rest, restored, strict=True):
        assert torch.equal(a, b) and ta == tb
    full = module(shuffle_buffer=None)
    full.setup("fit")
    assert not full.train_dataset.block_reads
    assert sorted(paired_ids(list(full.train_dataloader()))) == sorted(paired_ids(batches))


class BatchOfOne:
    """A tokenizer that gives each caption a batch of one (``1 x 3``), as open_clip's and the hubs' tokenizers do."""

    def __init__(self, as_dict: bool) -> None:
        self.as_dict = as_dict

    def __call__(self, text: str) -> torch.Tensor | dict[str, torch.Tensor]:
        ids = torch.tensor([[caption_id(text), 7, 0]])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)} if self.as_dict else ids


@pytest.mark.timeout(120)
@pytest.mark.parametrize("as_dict", [False, True], ids=["tensor", "dict"])
def test_a_tokenizer_that_returns_a_batch_of_one_gives_n_by_l(tmp_path: Path, as_dict: bool) -> None:
    """open_clip's tokenizer gives a string ``1 x 77``: a batch of N captions is ``N x 77`` (``N x 1 x 77`` broke
    open_clip's text tower), each row its own image's caption."""
    write_shards(tmp_path / "train", 12, 8)
    dm = ImageTextDataModule(str(tmp_path / "train"), batch_size=4, num_workers=2, image_size=32,
                             text_transform=BatchOfOne(as_dict), index_dir=str(tmp_path / "index"))  # fmt: skip
    dm.setup("fit")
    for images, tokens in dm.train_dataloader():
        ids = tokens["input_ids"] if as_dict else tokens
        assert ids.shape == (len(images), 3) and [id_of(im) for im in images] == ids[:, 0].tolist()
        if as_dict:
            assert tokens["attention_mask"].shape == ids.shape


@pytest.mark.timeout(120)
def test_an_undecodable_image_is_raised_naming_it_or_skipped_and_counted(tmp_path: Path) -> None:
    """Key 7's JPEG is cut short (a download that broke off): by default the loader names it; with
    ``on_corrupt="skip"`` its pair is left out of its batch, every other caption with its own image, and the skip
    counted over the 2 workers; past ``max_corrupt_fraction`` the epoch stops, naming it."""
    write_shards(tmp_path / "train", 16, 8)
    with tarfile.open(tmp_path / "train" / "00000.tar") as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(tmp_path / "train" / "00000.tar", "w") as tf:
        for info, data in members:
            if info.name == f"{7:09d}.jpg":
                data = data[: len(data) // 3]
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

    def module(**kw: object) -> ImageTextDataModule:
        return ImageTextDataModule(str(tmp_path / "train"), batch_size=4, num_workers=2, image_size=32,
                                   index_dir=str(tmp_path / "index"), **kw)  # type: ignore[arg-type]  # fmt: skip

    dm = module()
    dm.setup("fit")
    with pytest.raises(Exception, match=r"(?s)00000\.tar:000000007 is not a readable image.*on_corrupt='skip'"):
        list(dm.train_dataloader())
    dm = module(on_corrupt="skip", max_corrupt_fraction=0.1)
    dm.setup("fit")
    ids = []
    for images, texts in dm.train_dataloader():
        ids += [caption_id(t) for t in texts]
        assert [id_of(im) for im in images] == [caption_id(t) for t in texts]
    assert sorted(ids) == [k for k in range(16) if k not in (3, 5, 7)]
    assert dm.train_dataset.skipped_count(0) == 1
    strict = module(on_corrupt="skip", max_corrupt_fraction=0.0)
    strict.setup("fit")
    with pytest.raises(Exception, match=r"1 corrupt image\(s\) skipped in epoch 0, more than max_corrupt_fraction=0"):
        list(strict.train_dataloader())
