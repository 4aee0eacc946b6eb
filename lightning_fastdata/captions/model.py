"""``ContrastiveModel``: a LightningModule that trains a CLIP-style model on ``ImageTextDataModule``'s pairs.

The loss is CLIP's symmetric InfoNCE: the batch's image and text embeddings, L2-normalised, their cosine similarities
times a learned temperature (``logit_scale``, clamped at 100 as open_clip does), cross-entropy from each image to its
caption and from each caption to its image, averaged. On several ranks each rank's loss uses its own batch (open_clip's
``--gather-with-grad`` is not done here).

Evaluation keeps every pair's two embeddings and gathers them from every rank at the epoch's end (the package's
evaluation loaders give each pair to one rank): the figures are the whole split's, the same on 1 or N ranks:

- ``{stage}_loss``: the InfoNCE loss over the whole split as one batch;
- ``{stage}_image_to_text_r1``/``_r5`` and ``{stage}_text_to_image_r1``/``_r5``: the fraction of pairs whose own
  caption (image) is among the 1 or 5 most similar of the split's (open_clip's retrieval metrics; ties count for the
  pair);
- ``{stage}_zero_shot_acc`` with ``zero_shot_classes``: each image classified by the most similar of the classes'
  prompts (``zero_shot_template``), against the class its caption names (a caption that names none or several
  classes is left out; ``{stage}_zero_shot_images`` counts those kept). Names are matched on token ids, so the
  captions may arrive tokenized (``text_transform``).

The model is :class:`~lightning_fastdata.captions.model.TinyCLIP` (a torchvision image encoder from scratch, a
bag-of-words text encoder) unless ``model=`` gives another with open_clip's interface (``encode_image``,
``encode_text``, ``logit_scale``): ``open_clip.create_model("ViT-B-32")`` with
``tokenizer=open_clip.get_tokenizer("ViT-B-32")``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch import LightningModule
from torch import nn
from typing_extensions import override

from lightning_fastdata.captions.text import HashTokenizer
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.models import _EPOCH_VALUE, fused_adamw

__all__ = ["ContrastiveModel", "TinyCLIP", "recall_at", "symmetric_infonce"]

_CHUNK = 4096  # rows of the similarity matrix at a time in evaluation


class TinyCLIP(nn.Module):
    """A small CLIP: a torchvision classifier as the image encoder, mean word embeddings as the text encoder.

    Args:
        embed_dim: The shared embedding's size.
        image_arch: A ``torchvision.models`` classifier, built from scratch, its head giving ``embed_dim``.
        vocab: Token ids ``0 .. vocab - 1`` (0: padding, left out of the mean).
        text_width: The word embeddings' size.
    """

    def __init__(self, embed_dim: int = 128, image_arch: str = "resnet18", vocab: int = 49408, text_width: int = 256):
        super().__init__()
        self.visual = torchvision.models.get_model(image_arch, weights=None, num_classes=embed_dim)
        self.token_embedding = nn.Embedding(vocab, text_width, padding_idx=0)
        self.text_projection = nn.Sequential(nn.LayerNorm(text_width), nn.Linear(text_width, embed_dim))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """The images' embeddings (not normalised)."""
        return self.visual(images)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """The captions' embeddings (not normalised) from their ``N x L`` token ids."""
        mask = (tokens != 0).unsqueeze(-1).to(self.token_embedding.weight.dtype)
        words = (self.token_embedding(tokens) * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return self.text_projection(words)


def symmetric_infonce(images: torch.Tensor, texts: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """CLIP's loss of normalised embeddings, pair ``i`` being row ``i`` of both; rows in chunks (any ``N``)."""
    n = len(images)
    total = images.new_zeros(())
    for other, this in ((texts, images), (images, texts)):
        for start in range(0, n, _CHUNK):
            logits = scale * this[start : start + _CHUNK] @ other.T
            own = logits.diagonal(offset=start)  # pair i's logit, for the rows of this chunk
            total = total + (torch.logsumexp(logits, dim=1) - own).sum()
    return total / (2 * n)


def recall_at(queries: torch.Tensor, keys: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[int, float]:
    """The fraction of rows ``i`` of ``queries`` whose key ``i`` is among the ``k`` most similar keys.

    A key as similar as the pair's own counts for the pair (a tie is no miss).
    """
    above = torch.empty(len(queries), dtype=torch.int64)
    for start in range(0, len(queries), _CHUNK):
        sims = queries[start : start + _CHUNK] @ keys.T
        own = sims.diagonal(offset=start).unsqueeze(1)
        above[start : start + len(sims)] = (sims > own).sum(1).cpu()
    return {k: float((above < k).double().mean()) for k in ks}


class ContrastiveModel(LightningModule):
    """Contrastive image-text training with retrieval and zero-shot evaluation (module docstring).

    Args:
        model: A module with open_clip's interface (``encode_image``, ``encode_text``, ``logit_scale``);
            ``None``: :class:`~lightning_fastdata.captions.model.TinyCLIP` of ``embed_dim`` and ``image_arch``.
        embed_dim: The default model's embedding size.
        image_arch: The default model's image encoder (a ``torchvision.models`` classifier).
        tokenizer: What turns a caption into token ids (a callable of a string giving a tensor): the batch's
            captions when they arrive as strings, and the zero-shot prompts; use the DataModule's
            ``text_transform``. ``None``: :class:`~lightning_fastdata.captions.text.HashTokenizer`.
        zero_shot_classes: Class names for zero-shot accuracy on the validation pairs; ``None``: none.
        zero_shot_template: Each class's prompt, ``{}`` its name (open_clip's simplest; the demo's config: ``"a photo
            of a {} shape."``).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay (open_clip's 0.1 for large runs, 0.2 for ViTs).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        embed_dim: int = 128,
        image_arch: str = "resnet18",
        tokenizer: Callable[[str], Any] | None = None,
        zero_shot_classes: list[str] | None = None,
        zero_shot_template: str = "a photo of a {}.",
        lr: float = 5e-4,
        weight_decay: float = 0.1,
    ) -> None:
        super().__init__()
        save_init_hparams(self)
        self.model: Any = model if model is not None else TinyCLIP(embed_dim, image_arch)  # open_clip's interface
        self.tokenizer: Callable[[str], Any] = tokenizer if tokenizer is not None else HashTokenizer()
        self.zero_shot_classes = list(zero_shot_classes) if zero_shot_classes else []
        self.zero_shot_template = zero_shot_template
        self._records: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def tokens(self, texts: Any) -> torch.Tensor:
        """The batch's captions as token ids on the model's device.

        Strings are tokenized; a tokenizer's tensors (or its dict's ``input_ids``) are taken as they are.
        """
        if isinstance(texts, dict):
            texts = texts["input_ids"]
        if not isinstance(texts, torch.Tensor):
            texts = torch.stack([torch.as_tensor(self.tokenizer(t)).reshape(-1) for t in texts])
        return texts.to(self.device)

    def embed(self, images: torch.Tensor, texts: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalised image and text embeddings, and the captions' token ids."""
        tokens = self.tokens(texts)
        image = F.normalize(self.model.encode_image(images).float(), dim=-1)
        text = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return image, text, tokens

    def _scale(self) -> torch.Tensor:
        return self.model.logit_scale.exp().clamp(max=100.0)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """CLIP's loss of the batch's pairs (logged as ``train_loss``, the temperature as ``logit_scale``)."""
        image, text, _ = self.embed(batch[0], batch[1])
        loss = symmetric_infonce(image, text, self._scale())
        self.log("train_loss", loss.detach(), prog_bar=True, batch_size=len(image))
        self.log("logit_scale", self._scale().detach(), batch_size=len(image))
        return loss

    def _evaluate(self, batch: Any, stage: str) -> None:
        with torch.no_grad():
            image, text, tokens = self.embed(batch[0], batch[1])
        self._records.setdefault(stage, []).append((image.cpu(), text.cpu(), self._zero_shot_labels(tokens).cpu()))

    def _name_tokens(self) -> list[set[int]]:
        """Each class name's token ids (the tokenizer's ids of an empty string, its start and end, left out)."""
        empty = set(torch.as_tensor(self.tokenizer("")).reshape(-1).tolist())
        return [set(torch.as_tensor(self.tokenizer(c)).reshape(-1).tolist()) - empty for c in self.zero_shot_classes]

    def _zero_shot_labels(self, tokens: torch.Tensor) -> torch.Tensor:
        """The class each caption names (-1: none or several), from its token ids."""
        labels = torch.full((len(tokens),), -1, dtype=torch.int64)
        names = self._name_tokens() if self.zero_shot_classes else []
        for i, row in enumerate(tokens.tolist()):
            present = set(row)
            named = [c for c, ids in enumerate(names) if ids and ids <= present]
            if len(named) == 1:
                labels[i] = named[0]
        return labels

    def _gathered(self, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every rank's pairs: image and text embeddings, zero-shot labels.

        In one order whatever the ranks (sorted by their values), so the figures of N ranks are one rank's to the bit.
        """
        records = self._records.pop(stage, [])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            parts: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, records)
            records = [r for part in parts for r in part]
        if not records:
            return torch.empty(0, 0), torch.empty(0, 0), torch.empty(0, dtype=torch.int64)
        image, text, labels = (torch.cat([r[k] for r in records]) for k in range(3))
        order = torch.from_numpy(np.lexsort(torch.cat([image, text], 1).numpy().T[::-1]).copy())
        return image[order], text[order], labels[order]

    def evaluation_scores(self, stage: str) -> dict[str, float]:
        """The ``stage`` epoch's figures over every rank's pairs (names as logged, without the stage)."""
        image, text, labels = self._gathered(stage)
        if len(image) == 0:
            return {}
        scale = self._scale().detach().cpu()
        out = {"loss": float(symmetric_infonce(image, text, scale))}
        for name, (queries, keys) in {"image_to_text": (image, text), "text_to_image": (text, image)}.items():
            for k, value in recall_at(queries, keys).items():
                out[f"{name}_r{k}"] = value
        if self.zero_shot_classes:
            prompts = [self.zero_shot_template.format(c) for c in self.zero_shot_classes]
            with torch.no_grad():
                classes = F.normalize(self.model.encode_text(self.tokens(prompts)).float(), dim=-1).cpu()
            kept = labels >= 0
            predicted = (image[kept] @ classes.T).argmax(1)
            out["zero_shot_images"] = float(kept.sum())
            out["zero_shot_acc"] = float((predicted == labels[kept]).double().mean()) if kept.any() else 0.0
        return out

    def _log_evaluation(self, stage: str) -> None:
        for name, value in self.evaluation_scores(stage).items():
            self.log(f"{stage}_{name}", torch.tensor(value), prog_bar=name == "image_to_text_r1", **_EPOCH_VALUE)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """Keeps the batch's embeddings for the epoch's figures."""
        self._evaluate(batch, "val")

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        """As validation: ``test_loss``, ``test_image_to_text_r1``, ..."""
        self._evaluate(batch, "test")

    @override
    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """The batch's normalised image embeddings.

        A DataModule's predict batch (``predict_root=``): ``{"indices": ..., "embeddings": ...}``, each input's index
        (``dm.predict_path(i)`` names it) with its row; ``(images, ...)``: the embeddings alone.
        """
        images = batch.images if hasattr(batch, "images") else batch[0]
        embeddings = F.normalize(self.model.encode_image(images).float(), dim=-1)
        if hasattr(batch, "indices"):
            return {"indices": batch.indices, "embeddings": embeddings}
        return embeddings

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters (fused where torch has the kernel)."""
        return fused_adamw(self, self.hparams["lr"], self.hparams["weight_decay"])
