"""LitData reading the same bucket, for ``bench.s3``: the peer the object-storage issue compares against.

What a LitData user writes for this data (its ImageNet example's shape): ``litdata.optimize`` packs the JPEGs'
bytes into chunks (here 8 MB: the 1,024-image set would otherwise be two chunks for two workers), the chunks go
to the bucket, and a ``StreamingDataset`` on the URL downloads chunks into a local cache and decodes each JPEG
(``torchvision.io.decode_jpeg``, LitData's serializer) before torchvision's v2 ``RandomResizedCrop``, flip and
normalise. Two cache settings: ``max_cache_size`` below the data's size (it evicts what it read, so every epoch
downloads everything again: data bigger than the local disk), and a cache that holds the data, timed after one
epoch filled it (every later epoch reads the local disk).

LitData 0.2.76 builds its obstore client without ``allow_http``, so it cannot reach an ``http://`` endpoint (the
local server): importing this module sets that option in LitData's client options (in every worker too, since
its workers import this module to unpickle the dataset).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

__all__ = ["LitDataImages", "labelled_files", "litdata_loader", "optimize_folder", "optimize_to_bucket"]

try:
    import litdata
    import litdata.streaming.downloader as _downloader

    _downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    _Base: Any = litdata.StreamingDataset
except ImportError:  # the rows are skipped (and said so) without litdata
    litdata = None
    _Base = object


def _item(arg: tuple[str, int]) -> dict[str, Any]:
    from PIL import Image

    path, label = arg
    return {"image": Image.open(path), "label": label}  # LitData stores a JPEG file's own bytes


def labelled_files(root: str | Path) -> list[tuple[str, int]]:
    """Every file of the class folder ``root`` with its class number (classes sorted by name, files by name)."""
    root = Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(f), label) for label, c in enumerate(classes) for f in sorted((root / c).iterdir())]


def optimize_folder(root: str | Path, out: Path, chunk_bytes: str) -> None:
    """``litdata.optimize`` the class folder ``root`` into ``out``: each JPEG's own bytes and its label, in chunks."""
    litdata.optimize(
        fn=_item,
        inputs=labelled_files(root),
        output_dir=str(out),
        chunk_bytes=chunk_bytes,
        num_workers=2,
        verbose=False,
    )


def optimize_to_bucket(root: Path, work: Path, url: str, storage_options: dict[str, Any], chunk_bytes: str) -> int:
    """``litdata.optimize`` the class folder ``root`` into ``work``, upload the chunks to ``url``; their total bytes."""
    from benchmarks.s3_server import upload_folder

    out = work / "litdata-optimized"
    optimize_folder(root, out, chunk_bytes)
    upload_folder(out, url, storage_options)
    return sum(f.stat().st_size for f in out.iterdir())


class LitDataImages(_Base):
    """A ``StreamingDataset`` returning ``(normalised float image, label)``: decode, v2 crop/flip, normalise.

    ``normalise=False``: the uint8 crop instead (what the peers suite compares: normalising is left to the device).
    """

    def __init__(self, *args: Any, size: int = 224, normalise: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import torch
        from torchvision.transforms import v2

        steps = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
        if normalise:
            steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
        self.tf = v2.Compose(steps)

    def __getitem__(self, index: Any) -> tuple[Any, int]:
        item = super().__getitem__(index)
        return self.tf(item["image"]), item["label"]


def litdata_loader(
    url: str,
    endpoint: str,
    s3: Any,
    work: Path,
    batch_size: int,
    workers: int,
    size: int,
    max_cache_size: str | None,
    warm: bool,
) -> Any:
    """A ``StreamingDataLoader`` on ``url`` through ``endpoint``, with a fresh cache directory under ``work``.

    ``warm``: read one whole epoch first (untimed), so the timed epochs find every chunk in the local cache.
    """
    storage_options = {
        "endpoint_url": endpoint,
        "aws_access_key_id": s3.access_key_id,
        "aws_secret_access_key": s3.secret_access_key,
        "region_name": "us-east-1",
    }
    cache = tempfile.mkdtemp(prefix="litdata-cache-", dir=work)
    dataset = LitDataImages(
        url, cache_dir=cache, shuffle=True, storage_options=storage_options, max_cache_size=max_cache_size, size=size
    )
    loader = litdata.StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
    )
    if warm:
        for _ in loader:
            pass
    return loader


def available() -> bool:
    """Whether LitData imports here (the ``s3-bench`` extra)."""
    return litdata is not None
