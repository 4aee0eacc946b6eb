"""``HashTokenizer``: a dependency-free tokenizer of open_clip's shape, for examples, tests and the bench.

open_clip's tokenizers turn a caption into ``context_length`` (77) int64 ids, 0-padded; this one does the same with
each lower-case word's CRC32 as its id (no vocabulary file, the same ids in every process and on every machine).
Picklable, so it runs in the loader workers as ``ImageTextDataModule(text_transform=HashTokenizer())``. A real model
uses its own tokenizer (``open_clip.get_tokenizer(...)``) in the same place.
"""

from __future__ import annotations

import re
import zlib

import torch

__all__ = ["HashTokenizer"]

_WORD = re.compile(r"[a-z0-9]+")


class HashTokenizer:
    """Words hashed to ids ``1 .. vocab - 1`` (0: padding), cut or padded to ``context_length``.

    Args:
        context_length: Ids per caption (open_clip's 77).
        vocab: Size of the id space (open_clip's 49408).
    """

    def __init__(self, context_length: int = 77, vocab: int = 49408) -> None:
        self.context_length, self.vocab = context_length, vocab

    def __call__(self, text: str) -> torch.Tensor:
        """``text``'s ids, ``context_length`` int64 values."""
        words = _WORD.findall(text.lower())[: self.context_length]
        out = torch.zeros(self.context_length, dtype=torch.int64)
        out[: len(words)] = torch.tensor([1 + zlib.crc32(w.encode()) % (self.vocab - 1) for w in words])
        return out

    def __repr__(self) -> str:
        return f"HashTokenizer(context_length={self.context_length}, vocab={self.vocab})"
