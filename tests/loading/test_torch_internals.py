"""What the shared-memory pool relies on in torch's private APIs (``loading/transport/torch_internals.py``), pinned.

A torch upgrade that changes one of these fails here first, by name, instead of as a corrupt batch elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lightning_fastdata.loading.transport import torch_internals

pytestmark = pytest.mark.skipif(bool(torch_internals.MISSING), reason=f"missing: {torch_internals.MISSING}")


def test_new_shared_storage_is_in_shared_memory_and_has_a_descriptor() -> None:
    storage = torch_internals.new_shared_storage(4096)
    assert storage.is_shared() and storage.nbytes() == 4096
    fd, size = torch_internals.reserve_pages(storage)
    assert fd >= 0 and size == 4096


def test_use_count_counts_tensors_and_views_of_a_storage() -> None:
    storage = torch_internals.new_shared_storage(64)
    assert torch_internals.storage_use_count(storage) == 1
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (8, 8))
    view = tensor[2:4]
    assert torch_internals.storage_use_count(storage) == 3
    del tensor, view
    assert torch_internals.storage_use_count(storage) == 1


def test_a_tensors_storage_object_is_the_one_it_was_built_on() -> None:
    """The pool's "nobody else holds it" check counts references to this very Python object."""
    storage = torch_internals.new_shared_storage(64)
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (64,))
    assert tensor.untyped_storage() is storage
    assert tensor[10:].untyped_storage() is storage


_LIFECYCLE = """
import gc, pickle
import torch
from torch.multiprocessing import reductions
from torch.multiprocessing.reductions import shared_cache
from lightning_fastdata.loading.transport import shm_pool
from lightning_fastdata.loading.transport import torch_internals
from lightning_fastdata.loading.transport.collate import collate_prebatched, empty_image_batch
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader

class Zeros(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitems__(self, keys):
        return empty_image_batch(len(keys), 4, 4).zero_(), torch.tensor(keys)

print("BEFORE", torch_internals.storage_reducer() is reductions.reduce_storage)
loader = PrefetchingDataLoader(Zeros(), batch_size=4, num_workers=2, collate_fn=collate_prebatched,
                               batch_transport="shm_pool", persistent_workers=True)
for batch in loader:
    pass
print("WHILE", torch_internals.storage_reducer() is shm_pool._reduce_storage)
storage = batch[0].untyped_storage()  # through the wrapper it still pickles as torch's reducer does it
data = bytes(torch_internals.ForkingPickler.dumps(storage))
shared_cache.clear()
print("PICKLES", bytes(pickle.loads(data)) == bytes(storage))
del batch, storage, loader
gc.collect()
print("AFTER", torch_internals.storage_reducer() is reductions.reduce_storage, shm_pool.main_cache_stats())
"""


def test_torchs_storage_reducer_is_wrapped_only_while_pooled_workers_are_cached(tmp_path: Path) -> None:
    from helpers.fork_client import SERVER

    script = tmp_path / "lifecycle.py"
    script.write_text(_LIFECYCLE)
    code, out = SERVER.command([str(script)], tmp_path, tmp_path / "lifecycle.log")
    assert code == 0, out
    assert "BEFORE True" in out and "WHILE True" in out and "PICKLES True" in out
    assert "AFTER True {'workers': 0, 'buffers': 0, 'outstanding': 0}" in out, out


_HIDDEN = """
import warnings
import torch
del torch._C._storage_Use_Count  # as a torch without it would be
from lightning_fastdata.loading.transport import torch_internals
from lightning_fastdata.loading.transport.collate import collate_prebatched, empty_image_batch
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader

class Ramp(torch.utils.data.Dataset):
    def __len__(self):
        return 40
    def __getitems__(self, keys):
        images = empty_image_batch(len(keys), 4, 4)
        images.copy_(torch.tensor(keys, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 4, 4))
        return images, torch.tensor(keys)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaders = [PrefetchingDataLoader(Ramp(), batch_size=8, num_workers=2, collate_fn=collate_prebatched,
                                     batch_transport="shm_pool") for _ in range(2)]
print("MISSING", torch_internals.MISSING)
print("WARNINGS", sum("batch_transport='torch'" in str(w.message) for w in caught))
print("REPR", repr(loaders[0]))
ok = all(bool((images == labels.view(-1, 1, 1, 1)).all()) for images, labels in loaders[1])
print("BATCHES", ok, len(list(loaders[1])))
"""


def test_without_the_private_api_batches_travel_torchs_way_with_one_warning() -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_HIDDEN)], capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "MISSING ['torch._C._storage_Use_Count']" in out
    assert "WARNINGS 1" in out  # once, for two loaders
    assert "batch_transport='torch'" in out.split("REPR", 1)[1]
    assert "BATCHES True 5" in out


def test_the_refcount_the_pool_frees_by_is_checked_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A buffer is freed only when the cache's entry is its last reference; an interpreter that counts otherwise
    is caught at import (the pool is then not used) instead of freeing a buffer a user still holds."""
    holder = {0: torch.UntypedStorage(8)}
    assert torch_internals.held_only_by(holder, 0)
    kept = holder[0]
    assert not torch_internals.held_only_by(holder, 0)
    del kept
    assert torch_internals.held_only_by(holder, 0)
    assert torch_internals._refcount_holds()
    monkeypatch.setattr(torch_internals.sys, "getrefcount", lambda obj: 1)  # another interpreter's count
    assert not torch_internals._refcount_holds()
    assert any(name.startswith("sys.getrefcount") for name in torch_internals._missing())
