"""One rank of a 2-node CPU DDP fit (gloo), launched by hand as each node's rank 0, recording index lookups.

argv: data root, output folder, node rank, kind ("folder" or "cache"), index dir, cache dir, prepare_data_per_node
("1"/"0").
Writes OUT/node<k>.json: each index lookup (reused?, why) and cache build this process made, and what it trained on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning_fastdata import ImageClassifier, ImageFolderDataModule, TensorCacheDataModule
from lightning_fastdata.datamodules import cache as cache_dm
from lightning_fastdata.loading.index.store import IndexStore
from lightning_fastdata.testing import cpu_trainer

if __name__ == "__main__":
    root, out, node, kind, index_dir, cache_dir, per_node = sys.argv[1:8]
    events: list[dict] = []
    found = IndexStore.folder  # what LocalStorage.indexed calls: one lookup of a kept scan

    def recorded(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        index, lookup = found(self, *args, **kwargs)
        events.append({"event": "index", "reused": lookup.reused, "why": lookup.why, "files": len(index)})
        return index, lookup

    IndexStore.folder = recorded
    build = cache_dm.build_tensor_cache

    def build_recorded(cache_dir_, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        before = (Path(cache_dir_) / "manifest.json").exists()
        result = build(cache_dir_, *args, **kwargs)
        events.append({"event": "cache", "existed": before})
        return result

    cache_dm.build_tensor_cache = build_recorded
    kw = dict(image_size=16, batch_size=4, num_workers=0, val_fraction=0, index_dir=index_dir)
    if kind == "cache":
        dm = TensorCacheDataModule(root, cache_dir, cache_size=24, build_processes=1, **kw)
    else:  # the file lists' lookups alone (the default entropy index would list the files once more)
        dm = ImageFolderDataModule(root, entropy_index=False, **kw)
    dm.prepare_data_per_node = per_node == "1"
    trainer = cpu_trainer(strategy="ddp", devices=1, num_nodes=2, max_steps=2, epochs=-1)
    trainer.fit(ImageClassifier(num_classes=dm.num_classes), dm)
    record = {"events": events, "global_rank": trainer.global_rank, "world": trainer.world_size}
    (Path(out) / f"node{node}.json").write_text(json.dumps(record))
