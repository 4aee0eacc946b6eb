"""``MixedSegmentation``: several segmentation sources' training sets as one index space, masks in one class list.

What :class:`~lightning_fastdata.MixedDataModule` draws from when its sources are
:class:`~lightning_fastdata.SegmentationDataModule` objects: sample ``i`` is source ``s``'s sample ``i - offsets[s]``,
rendered by that source (its layout, its windows, its mask table), its mask's classes renumbered into the mix's class
list by name (each source's target relabelled by the mix:
:meth:`~lightning_fastdata.sources.windowed.WindowedDataset.renumbered`). A batch's samples are read source by source
and returned in the order asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.sources.windowed import WindowedDataset, sample_key

__all__ = ["MixedSegmentation"]


class MixedSegmentation(Dataset):
    """The training sets of several segmentation sources as one (module docstring).

    Args:
        sources: Each source's training dataset (masks already renumbered into the mix's classes).
        names: A name per source, for messages.
    """

    def __init__(self, sources: Sequence[WindowedDataset], names: Sequence[str]) -> None:
        self.sources = list(sources)
        self.names = tuple(names)
        self.offsets = np.cumsum([0] + [len(s) for s in self.sources]).astype(np.int64)

    @property
    def targets(self) -> np.ndarray:
        """One 0 per sample: a mix draws by its sources' shares (their own targets), never by these."""
        return np.zeros(len(self), dtype=np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitems__(self, keys: Sequence[Any]) -> Batch:
        """Each source's samples read together; the batch in the order asked."""
        full = [sample_key(k, len(self)) for k in keys]
        which = np.searchsorted(self.offsets, [k[1] for k in full], side="right") - 1
        images: list[torch.Tensor | None] = [None] * len(full)
        masks: list[torch.Tensor | None] = [None] * len(full)
        for s in np.unique(which):
            slots = np.flatnonzero(which == s)
            local = [(full[j][0], full[j][1] - int(self.offsets[s]), full[j][2]) for j in slots]
            batch = self.sources[int(s)].__getitems__(local)
            for k, j in enumerate(slots):
                images[j], masks[j] = batch.images[k], batch.labels[k]
        return Batch(torch.stack(images), torch.stack(masks))  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(image, mask)`` of one sample."""
        images, masks = self.__getitems__([key])
        return images[0], masks[0]
