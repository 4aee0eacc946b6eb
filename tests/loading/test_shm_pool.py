"""Reused shared-memory batch buffers: batches stay intact however long they are held, buffers are reused."""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from queue import Empty

import pytest
import torch
from torch.multiprocessing.reductions import shared_cache
from torch.utils.data import DataLoader, Dataset

from lightning_fastdata.loading.transport import torch_internals
from lightning_fastdata.loading.transport.collate import collate_prebatched, empty_image_batch
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.loading.transport.shm_pool import MAX_SLOTS, WorkerPool, main_cache_stats

pytestmark = pytest.mark.skipif(
    bool(torch_internals.MISSING), reason=f"this torch lacks the pool's primitives: {torch_internals.MISSING}"
)

SIDE = 8


def expected(keys: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images filled with a value per key (and a per-pixel ramp), labels = key * 3."""
    ramp = torch.arange(SIDE * SIDE * 3, dtype=torch.int64).reshape(SIDE, SIDE, 3)
    images = torch.stack([((ramp + k) % 251).to(torch.uint8) for k in keys]).permute(0, 3, 1, 2)
    return images, torch.tensor([k * 3 for k in keys])


class KeyedDataset(Dataset):
    """Writes each batch into ``empty_image_batch`` (a pooled buffer in workers), like the package's datasets."""

    def __len__(self) -> int:
        return 96

    def __getitems__(self, keys: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images = empty_image_batch(len(keys), SIDE, SIDE)
        ref, labels = expected(keys)
        images.copy_(ref)
        return images, labels


def make_loader(persistent: bool) -> DataLoader:
    return PrefetchingDataLoader(
        KeyedDataset(),
        batch_transport="shm_pool",
        batch_size=8,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_prebatched,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(0),
    )


def roundtrip(obj: object) -> object:
    """Pickle as a worker's queue does and unpickle as the main process would (a mapping of its own)."""
    data = bytes(ForkingPickler.dumps(obj))
    shared_cache.clear()  # else the same process gets its own storage object back, not a second mapping
    return pickle.loads(data)


def check(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = batch
    ref, ref_labels = expected([int(k) // 3 for k in labels])
    assert torch.equal(labels, ref_labels)
    assert torch.equal(images, ref)


def test_protocol_in_one_process_reuses_only_released_buffers() -> None:
    pool = WorkerPool()
    first = pool.acquire(1000)
    batch = (torch.empty(0, dtype=torch.uint8).set_(first, 0, (10, 10, 10)).fill_(7), torch.arange(10))
    packed = pool.pack(batch)
    assert packed is not None
    received = roundtrip(packed)
    assert type(received) is tuple and torch.equal(received[0], batch[0]) and torch.equal(received[1], batch[1])
    # Still referenced by `received`: a new buffer, never the held one.
    second = pool.acquire(1000)
    assert second.data_ptr() != first.data_ptr()
    del received, packed, batch
    gc.collect()
    # The next arrival polls: the first buffer is released and handed out again.
    roundtrip(pool.pack((torch.empty(0, dtype=torch.uint8).set_(second, 0, (1000,)), torch.zeros(1))))
    third = pool.acquire(1000)
    assert third.data_ptr() == first.data_ptr()


def test_masks_in_the_images_buffer_cross_as_a_view_and_hold_it_until_dropped() -> None:
    """A segmentation batch's masks live in the images' buffer (``empty_image_and_mask_batch``): they arrive as a view
    of the same cached buffer, with their values, and the buffer is not handed out again while only they hold it."""
    pool = WorkerPool()
    storage = pool.acquire(4 * 2 * 6 * 5)
    images = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (2, 6, 5, 3)).permute(0, 3, 1, 2)
    masks = torch.empty(0, dtype=torch.uint8).set_(storage, 3 * 60, (2, 6, 5))
    images.copy_(torch.arange(180, dtype=torch.uint8).reshape(2, 3, 6, 5))
    masks.copy_(torch.arange(60, dtype=torch.uint8).reshape(2, 6, 5) % 7)
    sent = (images.clone(), masks.clone())
    received = roundtrip(pool.pack((images, masks, torch.arange(2))))
    got_images, got_masks, keys = received  # type: ignore[misc]
    assert torch.equal(got_images, sent[0]) and torch.equal(got_masks, sent[1]) and torch.equal(keys, torch.arange(2))
    assert got_masks.untyped_storage().data_ptr() == got_images.untyped_storage().data_ptr()
    del received, got_images, keys
    gc.collect()
    second = pool.acquire(240)
    roundtrip(pool.pack((torch.empty(0, dtype=torch.uint8).set_(second, 0, (240,)), torch.zeros(1))))
    assert pool.acquire(240).data_ptr() != storage.data_ptr()  # the masks still hold the first buffer
    assert torch.equal(got_masks, sent[1])
    del got_masks
    gc.collect()
    third = pool.acquire(240)
    roundtrip(pool.pack((torch.empty(0, dtype=torch.uint8).set_(third, 0, (240,)), torch.zeros(1))))
    assert pool.acquire(240).data_ptr() == storage.data_ptr()  # released once the masks were dropped too


def test_held_buffers_are_replaced_never_overwritten() -> None:
    pool = WorkerPool()
    held = []
    for value in range(MAX_SLOTS + 4):
        storage = pool.acquire(64)
        images = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (64,)).fill_(value)
        held.append(roundtrip(pool.pack((images, torch.tensor([value])))))
    for value, (images, labels) in enumerate(held):
        assert int(labels) == value
        assert bool((images == value).all()), f"held batch {value} was overwritten"
    assert len(pool.slots) == MAX_SLOTS


def test_batches_through_workers_are_intact_even_when_held() -> None:
    loader = make_loader(persistent=True)
    kept = []
    ptrs = set()
    for epoch in range(4):
        for batch in loader:
            check(batch)
            ptrs.add(batch[0].untyped_storage().data_ptr())
            if epoch == 1:
                kept.append(batch)  # a whole epoch held: the workers must allocate around it
    for batch in kept:
        check(batch)
    batches = 4 * len(loader)
    # Reused: far fewer distinct buffers than batches (the held epoch forces some replacements).
    assert len(ptrs) < batches / 2, (len(ptrs), batches)


def test_exited_workers_are_forgotten() -> None:
    gc.collect()
    before = main_cache_stats()["workers"]  # other tests' loaders may still be cached
    loader = make_loader(persistent=False)
    for _ in range(4):
        for batch in loader:
            check(batch)
        del batch
        # The epoch's end shut its two workers down, and they were forgotten then.
        assert main_cache_stats()["workers"] == before
    # An abandoned iterator leaves batches unread: its workers are forgotten when it is freed.
    it = iter(loader)
    next(it)
    assert main_cache_stats()["workers"] > before
    del it
    gc.collect()
    assert main_cache_stats()["workers"] == before


def snapshot(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage).clone()


def test_held_storage_objects_are_never_overwritten() -> None:
    loader = make_loader(persistent=True)
    held = []
    for epoch in range(2):
        for batch in loader:
            if epoch == 0 and len(held) < 20:
                storage = batch[0].untyped_storage()
                held.append((storage, snapshot(storage)))
            del batch
    assert len(held) == 12  # 96 / 8 batches in the first epoch
    changed = sum(not torch.equal(snapshot(storage), snap) for storage, snap in held)
    assert changed == 0, f"{changed} of {len(held)} batches held only through their storage were overwritten"


def _consume(queue: torch.multiprocessing.SimpleQueue, go: object, results: object, count: int) -> None:
    go.wait()  # type: ignore[attr-defined]
    bad = 0
    for _ in range(count):
        images, labels = queue.get()
        ref, _ = expected([int(k) // 3 for k in labels])
        bad += not torch.equal(images, ref)
    results.put(bad)  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_batches_handed_to_another_process_are_never_overwritten(method: str) -> None:
    ctx = torch.multiprocessing.get_context(method)
    queue, results, go = ctx.SimpleQueue(), ctx.SimpleQueue(), ctx.Event()
    count = 20
    consumer = ctx.Process(target=_consume, args=(queue, go, results, count))
    consumer.start()
    sent = 0
    loader = make_loader(persistent=True)
    while sent < count:
        for batch in loader:
            if sent < count:
                queue.put(batch)
                sent += 1
            del batch
    go.set()  # the consumer reads only now, after the workers produced many more batches
    bad = results.get()
    consumer.join(60)
    assert bad == 0, f"{bad} of {count} batches sent to another process were overwritten before it read them"


def test_more_than_1024_open_descriptors() -> None:
    extra = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(extra) >= 1024
        for batch in make_loader(persistent=False):
            check(batch)
    finally:
        for fd in extra:
            os.close(fd)


def test_buffers_are_freed_when_workers_exit() -> None:
    gc.collect()
    before = main_cache_stats()  # other tests' abandoned workers may still be in their grace period
    loader = make_loader(persistent=True)
    it = iter(loader)
    for batch in it:
        check(batch)
    del batch
    assert main_cache_stats()["buffers"] > before["buffers"]
    del it, loader  # the persistent workers exit; nothing else arrives to trigger a poll
    gc.collect()
    assert main_cache_stats()["workers"] == before["workers"]
    assert main_cache_stats()["buffers"] == before["buffers"]


_FULL_SHM = """
import os, sys, torch
from torch.utils.data import DataLoader
sys.path[:0] = sys.argv[1:]  # this test's folder, and tests/ (helpers)
from test_shm_pool import KeyedDataset, SIDE
import test_shm_pool
from lightning_fastdata.loading.transport import collate
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
class Big(KeyedDataset):
    def __getitems__(self, keys):
        return collate.empty_image_batch(len(keys), 512, 512), torch.zeros(len(keys))
import time
loader = PrefetchingDataLoader(
    Big(), batch_size=8, num_workers=1, collate_fn=collate.collate_prebatched, batch_transport="shm_pool"
)
it = iter(loader)
try:
    next(it)
except RuntimeError as err:
    print("ERROR:", err)
# the worker may be inside its next (prefetched) allocation, between torch creating the file and the unlink
# after the failure: shut it down first (directly: torch's reraise leaves the iterator in a reference cycle,
# and a shutdown from the garbage collector waits 5 s per worker); a leaked file stays, one in flight goes
it.inner._shutdown_workers()  # torch's iterator, inside our PrefetchIterator
deadline = time.monotonic() + 10
while os.listdir("/dev/shm") and time.monotonic() < deadline:
    time.sleep(0.05)
print("LEFT:", sorted(os.listdir("/dev/shm")))
"""


def test_full_dev_shm_leaves_no_file_behind(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a tiny private /dev/shm")
    script = tmp_path / "full_shm.py"
    script.write_text(_FULL_SHM)
    here = Path(__file__)
    shell = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && {sys.executable} {script} {here.parent} {here.parents[1]}"
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell], capture_output=True, text=True, timeout=120
    )
    if "mount" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {proc.stderr.strip()}")
    assert "ERROR:" in proc.stdout, proc.stdout + proc.stderr
    assert "No space left on device" in proc.stdout and "--shm-size" in proc.stdout
    assert "LEFT: []" in proc.stdout, proc.stdout


def _child_reads(queue: torch.multiprocessing.SimpleQueue, results: torch.multiprocessing.SimpleQueue) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(15, exit=True)  # a stuck child shows its stack in the test's output
    images, labels = queue.get()
    ref, _ = expected([int(k) // 3 for k in labels])
    results.put((bool(torch.equal(images, ref)), main_cache_stats()["workers"]))


def _loaders_run_to_the_end() -> list[DataLoader]:
    from lightning_fastdata.loading.transport.loaders import PrefetchingStatefulDataLoader

    loaders: list[DataLoader] = [make_loader(persistent=True), make_loader(persistent=False)]
    loaders.append(
        PrefetchingStatefulDataLoader(
            KeyedDataset(), batch_transport="shm_pool", batch_size=8, num_workers=2, collate_fn=collate_prebatched
        )
    )
    for loader in loaders:
        for _ in range(2):
            for batch in loader:
                check(batch)
    return loaders


def _fork_children_reading(batches: Iterator[tuple[torch.Tensor, torch.Tensor]], count: int) -> None:
    """Fork ``count`` children, send each a batch, and wait for what it read.

    The child's answer, not ``is_alive()``, says whether it got stuck: a thread that starts processes (a loader
    starting its workers) runs ``multiprocessing.process._cleanup``, which reaps every finished child of this
    process, and ``Popen.poll`` is not thread-safe, so ``is_alive()`` can call a child that already exited alive
    (measured: ``join`` returned after 0.02 s, ``is_alive()`` True, no such process). That was the "hang" this
    test once reported.
    """
    ctx = torch.multiprocessing.get_context("fork")
    for _ in range(count):
        queue, results = ctx.SimpleQueue(), ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(queue, results))
        child.start()
        queue.put(next(batches))
        try:
            intact, cached_in_child = results.get(timeout=25)
        except Empty:
            child.kill()
            pytest.fail("the forked child is stuck on the batch it received (its stack is in the captured stderr)")
        child.join(25)
        assert intact and cached_in_child == 0  # its own, empty cache: the parent's workers are not its


def test_a_child_forked_after_many_loaders_reads_its_batch() -> None:
    """Several loaders (persistent, not, stateful), one left mid-epoch, then forked children read its batches."""
    loaders = _loaders_run_to_the_end()
    mid_epoch = iter(loaders[0])
    check(next(mid_epoch))
    _fork_children_reading(mid_epoch, 5)


def test_a_child_forked_while_another_thread_reads_a_loader() -> None:
    loaders = _loaders_run_to_the_end()
    mid_epoch = iter(loaders[0])
    check(next(mid_epoch))
    stop = threading.Event()

    def keep_reading() -> None:  # workers forked, batches unpickled, in a second thread while the main one forks
        while not stop.is_set():
            for batch in loaders[2]:
                check(batch)

    reader = threading.Thread(target=keep_reading)
    reader.start()
    try:
        _fork_children_reading(mid_epoch, 5)
    finally:
        stop.set()
        reader.join(30)


def _stats_in_child(results: torch.multiprocessing.SimpleQueue) -> None:
    results.put(main_cache_stats())


def test_a_fork_while_another_thread_holds_the_cache_lock_does_not_block_the_child() -> None:
    from lightning_fastdata.loading.transport import shm_pool

    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with shm_pool._main().lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    ctx = torch.multiprocessing.get_context("fork")
    results = ctx.SimpleQueue()
    child = ctx.Process(target=_stats_in_child, args=(results,))
    try:
        child.start()
        child.join(10)
        assert not child.is_alive(), "the child waited for a lock a thread of its parent held at fork"
        assert results.get() == {"workers": 0, "buffers": 0, "outstanding": 0}
    finally:
        release.set()
        holder.join(10)
        if child.is_alive():
            child.kill()
