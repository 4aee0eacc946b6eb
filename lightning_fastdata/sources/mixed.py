"""``MixedWindowed``: several windowed sources' training sets as one index space, their targets in one class list.

What :class:`~lightning_fastdata.MixedDataModule` draws from when its sources are
:class:`~lightning_fastdata.SegmentationDataModule` or :class:`~lightning_fastdata.DetectionDataModule` objects (one
kind in a mix): sample ``i`` is source ``s``'s sample ``i - offsets[s]``, rendered by that source (its layout, its
windows or recipe, its target), its classes renumbered into the mix's class list by name (each source's target
relabelled by the mix: :meth:`~lightning_fastdata.sources.windowed.WindowedDataset.renumbered`). A batch's samples
are read source by source and batched together, in the order asked, by the target kind (images padded to the
largest; masks, or boxes packed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.sources.windowed import WindowedDataset, sample_key

__all__ = ["MixedWindowed"]


class MixedWindowed(Dataset):
    """The training sets of several windowed sources of one target kind as one (module docstring).

    Args:
        sources: Each source's training dataset (its target already renumbered into the mix's classes).
        names: A name per source, for messages.
    """

    def __init__(self, sources: Sequence[WindowedDataset], names: Sequence[str]) -> None:
        self.sources = list(sources)
        self.names = tuple(names)
        self.offsets = np.cumsum([0] + [len(s) for s in self.sources]).astype(np.int64)

    @property
    def targets(self) -> np.ndarray:
        """One 0 per sample, never drawn by (a mix draws by its sources' shares, from their own targets)."""
        return np.zeros(len(self), dtype=np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitems__(self, keys: Sequence[Any]) -> Any:
        """Each source's samples rendered together; the batch in the order asked (the first source's target kind)."""
        full = [sample_key(k, len(self)) for k in keys]
        which = np.searchsorted(self.offsets, [k[1] for k in full], side="right") - 1
        samples: list[Any] = [None] * len(full)
        for s in np.unique(which):
            slots = np.flatnonzero(which == s)
            local = [(full[j][0], full[j][1] - int(self.offsets[s]), full[j][2]) for j in slots]
            for j, sample in zip(slots, self.sources[int(s)].rendered(local)):
                samples[j] = sample
        return Batch(*self.sources[0].target.collate(samples))

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, Any]:
        """``(image, target)`` of one sample, as its source renders it."""
        full = sample_key(key, len(self))
        s = int(np.searchsorted(self.offsets, full[1], side="right") - 1)
        return self.sources[s].rendered([(full[0], full[1] - int(self.offsets[s]), full[2])])[0]
