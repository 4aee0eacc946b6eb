"""``trainer.validate`` of a ``ContrastiveModel`` on DEVICES CPU processes (gloo), the captions demo's shards.

The model is an exact one (:class:`ColourWords`: each image's mean colour, each caption's mean word vector, no
operation across a batch), so the embeddings of a pair are the same bits on any rank in any batch: the figures of
2 ranks must be one rank's exactly (the test runs one rank in its own process with :func:`run`). Writes
OUT/clip-<devices>-rank<k>.json: the metrics and the validation samples this rank served; with PREDICT (a folder of
images), ``trainer.predict`` too, its embeddings written by ``EmbeddingWriter`` into OUT/emb-<devices>/. argv: OUT
DEVICES ROOT [PREDICT].
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

import torch

try:  # run as a script (its folder first on the path), or imported by the test as helpers.ddp_clip
    from ddp_eval import Served
except ModuleNotFoundError:
    from helpers.ddp_eval import Served
from torch import nn

from lightning_fastdata import ContrastiveModel, EmbeddingWriter, ImageTextDataModule
from lightning_fastdata.captions.demos import CAPTION_COLOURS
from lightning_fastdata.captions.text import HashTokenizer
from lightning_fastdata.testing import cpu_trainer


class ColourWords(nn.Module):
    """Image: its mean colour in 8 dims (zero-padded); caption: the mean of its words' fixed random vectors."""

    def __init__(self, vocab: int = 49408) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, 8, padding_idx=0)
        nn.init.normal_(self.words.weight, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            self.words.weight[0] = 0
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(images.mean(dim=(2, 3)), (0, 5))

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.words(tokens).sum(1)


def run(out: str, devices: str, root: str, predict: str | None = None) -> None:
    """Validate (and predict) on ``devices`` ranks (this process rank 0); write this rank's figures and samples."""
    dm = ImageTextDataModule(f"{root}/train", val_root=f"{root}/val", image_size=32, batch_size=3, num_workers=2,
                             text_transform=HashTokenizer(), index_dir=f"{out}/index",
                             predict_root=predict)  # fmt: skip
    model = ContrastiveModel(model=ColourWords(), zero_shot_classes=list(CAPTION_COLOURS))
    served = Served()
    writer = EmbeddingWriter(f"{out}/emb-{devices}")
    trainer = cpu_trainer(served, writer, strategy="ddp" if int(devices) > 1 else "auto", devices=int(devices))
    if predict is not None:
        trainer.predict(model, datamodule=dm, return_predictions=False)
    results: dict[str, Any] = {"validate": trainer.validate(model, datamodule=dm, verbose=False)[0]}
    results["served"] = served.served
    Path(out, f"clip-{devices}-rank{trainer.global_rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    faulthandler.dump_traceback_later(200, exit=True)  # a rank that hangs says where, before the test's timeout
    run(*sys.argv[1:5])
