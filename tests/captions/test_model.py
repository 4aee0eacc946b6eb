"""The example contrastive model: CLIP's loss and retrieval figures against plain formulas, zero-shot labels from
tokens, learning the demo's pairs, the same figures on 2 ranks as on 1, and the shipped config from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_fastdata import ContrastiveModel, ImageTextDataModule
from lightning_fastdata.captions import model as clip
from lightning_fastdata.captions.demos import CAPTION_COLOURS, make_caption_shards
from lightning_fastdata.captions.text import HashTokenizer
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.testing import cpu_trainer


def test_loss_and_recall_equal_their_formulas_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """37 pairs in chunks of 8 rows: the loss is CLIP's (cross-entropy both ways over the whole similarity matrix);
    recall@k counts the pairs whose own key ranks within k (a tie with it is no miss)."""
    monkeypatch.setattr(clip, "_CHUNK", 8)
    g = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(37, 6, generator=g), dim=-1)
    texts = F.normalize(images + 0.9 * torch.randn(37, 6, generator=g), dim=-1)
    texts[5] = texts[4]  # two captions alike: text 4 ties text 5 for image 5
    scale = torch.tensor(7.0)
    logits = scale * images @ texts.T
    expected = (F.cross_entropy(logits, torch.arange(37)) + F.cross_entropy(logits.T, torch.arange(37))) / 2
    assert torch.allclose(clip.symmetric_infonce(images, texts, scale), expected, atol=1e-6)
    sims = images @ texts.T
    for k in (1, 5):
        ranks = [(sims[i] > sims[i, i]).sum().item() for i in range(37)]
        assert clip.recall_at(images, texts, (k,))[k] == sum(r < k for r in ranks) / 37
    assert 0 < clip.recall_at(images, texts)[1] < clip.recall_at(images, texts)[5] < 1


def test_zero_shot_labels_come_from_tokens_or_strings_alike() -> None:
    """The class a caption names, from its token ids: the same for strings and for the tokenizer's tensors; a
    caption naming no class or two is left out (-1)."""
    model = ContrastiveModel(zero_shot_classes=["red", "green"], embed_dim=8, image_arch="resnet18")
    texts = ["a red disc", "A GREEN square.", "a blue disc", "red and green"]
    tokens = model.tokens(texts)
    assert torch.equal(tokens, torch.stack([HashTokenizer()(t) for t in texts]))
    assert model._zero_shot_labels(tokens).tolist() == [0, 1, -1, -1]
    assert torch.equal(model.tokens({"input_ids": tokens}), tokens)


@pytest.mark.slow  # ~8 s on the 2-core VM
@pytest.mark.timeout(300)
def test_a_small_clip_learns_the_demo_pairs(tmp_path: Path) -> None:
    """4 epochs of the demo's 154 training pairs (tokenized in 2 workers): zero-shot by colour well above chance
    (1 in 5), and each image's caption among its 5 nearest far more often than chance (5 in 38)."""
    root = make_caption_shards(tmp_path / "pairs", count=200, size=(96, 72))
    kw = dict(image_size=48, batch_size=32, num_workers=2, text_transform=HashTokenizer())
    dm = ImageTextDataModule(str(root / "train"), val_root=str(root / "val"), index_dir=str(tmp_path / "i"), **kw)
    torch.manual_seed(0)
    model = ContrastiveModel(zero_shot_classes=list(CAPTION_COLOURS), zero_shot_template="a photo of a {} shape.",
                             embed_dim=64, lr=1e-3)  # fmt: skip
    trainer = cpu_trainer(epochs=4)
    trainer.fit(model, dm)
    assert dm.skipped == {"train": 6, "val": 2}  # every 25th key lost its image
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert metrics["val_zero_shot_images"] == 38  # 40 validation keys, 2 without an image
    assert metrics["val_zero_shot_acc"] >= 0.8
    assert metrics["val_image_to_text_r5"] >= 0.5 and metrics["val_text_to_image_r5"] >= 0.5
    assert metrics["val_image_to_text_r1"] <= metrics["val_image_to_text_r5"]


@pytest.mark.slow  # two DDP launches
@pytest.mark.timeout(300)
def test_two_ranks_give_one_ranks_figures_each_pair_once(tmp_path: Path) -> None:
    """``trainer.validate`` on 1 and on 2 ranks (gloo) with an exact model: the same loss, recall and zero-shot
    figures to the bit, and the 2 ranks served the 46 validation pairs once (one padded)."""
    from helpers.ddp_clip import run
    from helpers.fork_client import SERVER, rank_procs

    root = make_caption_shards(tmp_path / "pairs", count=240, size=(64, 48))
    photos = make_image_folder(tmp_path / "photos", num_classes=2, per_class=7, size=(40, 30))  # 14: odd shares
    run(str(tmp_path), "1", str(root), str(photos))  # one rank: this process
    script = Path(__file__).parents[1] / "helpers" / "ddp_clip.py"  # two: forked ranks, told theirs as torchrun does
    code, out = SERVER.command([str(script), str(tmp_path), "2", str(root), str(photos)], tmp_path,
                               tmp_path / "clip.log", procs=rank_procs(2))  # fmt: skip
    assert code == 0, out[-4000:]
    one = json.loads((tmp_path / "clip-1-rank0.json").read_text())
    two = [json.loads((tmp_path / f"clip-2-rank{r}.json").read_text()) for r in (0, 1)]
    served = sorted(two[0]["served"]["validate"] + two[1]["served"]["validate"])
    assert set(served) == set(range(46)) and len(served) == 46
    assert one["validate"]["val_zero_shot_images"] == 46 and 0 < one["validate"]["val_image_to_text_r5"] < 1
    for r in two:
        assert r["validate"] == one["validate"]
    # trainer.predict's embeddings (EmbeddingWriter): a row per image in input order, 2 ranks' files one rank's bits
    rows = [np.load(tmp_path / f"emb-{d}" / "embeddings.npy") for d in (1, 2)]
    tables = [(tmp_path / f"emb-{d}" / "paths.csv").read_text() for d in (1, 2)]
    assert rows[0].shape == (14, 8) and rows[0].dtype == np.float32 and np.array_equal(rows[0], rows[1])
    assert np.allclose(np.linalg.norm(rows[0], axis=1), 1, atol=1e-5)
    assert tables[0] == tables[1]
    paths = [line.split(",")[1] for line in tables[0].splitlines()[1:]]
    assert paths == sorted(str(p) for p in photos.rglob("*.jpg"))  # a nested folder's images, by path


@pytest.mark.slow  # the CLI: make-data, then fit from the shipped config
@pytest.mark.timeout(300)
def test_the_shipped_config_trains_from_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fastdata make-data --task captions`` then ``fastdata fit --config captions`` (one short epoch, the command's
    own entry point): it trains, validates and logs the retrieval and zero-shot figures."""
    from lightning_fastdata.cli import main

    monkeypatch.chdir(tmp_path)
    main(["make-data", "data/pairs", "--task", "captions", "--count", "60"])
    assert (tmp_path / "data" / "pairs" / "train" / "00000.tar").is_file()
    main(["fit", "--config", "captions", "--trainer.max_epochs", "1", "--data.init_args.image_size", "32",
          "--data.init_args.num_workers", "2", "--data.init_args.batch_size", "16", "--trainer.log_every_n_steps",
          "1", "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "logs"])  # fmt: skip
    metrics = next((tmp_path / "logs").rglob("metrics.csv")).read_text()
    for name in ("train_loss", "val_loss", "val_image_to_text_r1", "val_text_to_image_r5", "val_zero_shot_acc"):
        assert name in metrics.splitlines()[0], metrics.splitlines()[0]


@pytest.mark.timeout(180)
def test_trainer_predict_embeds_each_input_once_at_its_centre_square(tmp_path: Path) -> None:
    """``predict_root=`` a folder of images of several shapes: ``trainer.predict`` with ``ContrastiveModel`` gives each
    input once (its index, ``dm.predict_path`` its file) and its embedding of the centre square at ``image_size``:
    with an exact model (an image's mean colour), the colour open_clip's normalisation makes of the file's."""
    from helpers.captions import colour, jpeg
    from helpers.ddp_clip import ColourWords

    from lightning_fastdata.captions.datamodule import CLIP_MEAN, CLIP_STD

    root = make_caption_shards(tmp_path / "pairs", count=20, size=(64, 48))
    photos = tmp_path / "photos"
    (photos / "sub").mkdir(parents=True)
    for k in range(7):
        (photos / ("sub" if k % 2 else "") / f"{k}.jpg").write_bytes(jpeg(k, (40 + 9 * k, 70 - 4 * k)))
    dm = ImageTextDataModule(str(root / "train"), predict_root=str(photos), image_size=32, batch_size=3,
                             num_workers=2, index_dir=str(tmp_path / "index"))  # fmt: skip
    out = cpu_trainer().predict(ContrastiveModel(model=ColourWords()), datamodule=dm)
    indices = torch.cat([o["indices"] for o in out]).tolist()
    embeddings = torch.cat([o["embeddings"] for o in out])
    assert sorted(indices) == list(range(7)) and embeddings.shape == (7, 8)
    for i, e in zip(indices, embeddings):
        k = int(Path(dm.predict_path(i)).stem)
        expected = (torch.tensor(colour(k)) / 255 - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
        want = F.normalize(F.pad(expected, (0, 5)), dim=0)
        assert torch.allclose(e, want, atol=0.02), (k, e[:3], want[:3])
    batch = dm.on_after_batch_transfer(next(iter(dm.predict_dataloader())), 0)
    assert batch.images.shape == (3, 3, 32, 32) and batch.images.dtype == torch.float32  # the centre squares


def test_the_embedding_writer_says_what_it_needs(tmp_path: Path) -> None:
    """A prediction without N x D embeddings is refused, naming the key; a repeated input is named before a write."""
    from lightning_fastdata import EmbeddingWriter
    from lightning_fastdata.callbacks.predictions import each_input_once

    with pytest.raises(ValueError, match="dtype should be 'float32' or 'float16'"):
        EmbeddingWriter(str(tmp_path), dtype="int8")  # type: ignore[arg-type]
    writer = EmbeddingWriter(str(tmp_path), key="vectors")
    with pytest.raises(ValueError, match="an N x D tensor \\(or a dict with 'vectors'\\), got Tensor\\(3,\\)"):
        writer.write_on_batch_end(None, None, {"vectors": torch.zeros(3)}, None, None, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(
        RuntimeError, match="EmbeddingWriter got each input's index not exactly once \\(repeated: \\[1\\]"
    ):
        each_input_once(np.array([0, 1, 1, 2]), "EmbeddingWriter")
    each_input_once(np.arange(4), "EmbeddingWriter")
