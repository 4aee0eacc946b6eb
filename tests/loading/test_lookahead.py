"""Fetching the next batch ahead: the worker's guess of its next batch, and the store's read-ahead."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset, get_worker_info

from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3_server import LocalS3
from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.datasets.base import AugmentedImageDataset
from lightning_fastdata.loading.sampler import BatchLookahead, EpochSampler
from lightning_fastdata.loading.storage.object_store import ObjectStorage


class Recorder(Dataset):
    """Each batch comes back as (worker id, its keys, the lookahead's guess of that worker's next batch)."""

    def __init__(self, n: int, lookahead: BatchLookahead) -> None:
        self.n, self.lookahead = n, lookahead

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, keys: list[Any]) -> tuple[int, list[int], list[int] | None]:
        info = get_worker_info()
        assert info is not None
        guess = self.lookahead.after(keys, info.num_workers)
        return info.id, [int(k[1]) for k in keys], None if guess is None else guess.tolist()


def _check_guesses(sampler: EpochSampler, n: int, workers: int, batch: int) -> int:
    loader = DataLoader(Recorder(n, BatchLookahead(sampler)), batch_size=batch, sampler=sampler,
                        num_workers=workers, collate_fn=lambda b: b)  # fmt: skip
    by_worker: dict[int, list[tuple[list[int], list[int] | None]]] = defaultdict(list)
    for worker, got, guess in loader:
        by_worker[worker].append((got, guess))
    checked = 0
    for batches in by_worker.values():
        for (_, guess), (nxt, _) in zip(batches, batches[1:]):
            assert guess == nxt  # the guess is exactly the batch this worker was given next
            checked += 1
        assert batches[-1][1] is None or len(batches[-1][1]) < batch  # no guess past the epoch, or a short tail
    return checked


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_worker_guesses_its_next_batch_exactly(workers: int) -> None:
    sampler = EpochSampler(50, shuffle=True, seed=4)
    assert _check_guesses(sampler, 50, workers, batch=4) >= 12 - workers
    sampler.set_epoch(3)  # another permutation
    assert _check_guesses(sampler, 50, workers, batch=4) >= 12 - workers
    sampler.load_state_dict({"epoch": 3, "seed": 4, "yielded": 6})  # a resumed epoch starts mid-way
    assert _check_guesses(sampler, 50, workers, batch=4) >= 10 - workers


@pytest.mark.timeout(120)
def test_the_datamodule_sets_the_lookahead_on_a_bucket_train_set_with_workers(
    s3: LocalS3, s3_image_folder: str, image_folder: Path
) -> None:
    def sets(root: str, workers: int, **kw: Any) -> tuple[Any, Any]:
        dm = ImageFolderDataModule(root, batch_size=4, num_workers=workers, val_fraction=0.2, **kw)
        dm.setup("fit")
        return dm.train_dataloader().dataset, dm.val_dataloader().dataset

    train, val = sets(s3_image_folder, 2, storage_options=s3.storage_options())
    assert isinstance(train, AugmentedImageDataset) and isinstance(train.lookahead, BatchLookahead)
    assert getattr(val, "lookahead", None) is None
    assert sets(s3_image_folder, 0, storage_options=s3.storage_options())[0].lookahead is None  # no worker
    assert sets(str(image_folder), 2)[0].lookahead is None  # a local folder needs no head start


class AheadProbe(Dataset):
    """In a loader worker (where the store reads directly): a right guess, then a wrong one."""

    def __init__(self, storage: ObjectStorage, keys: list[str]) -> None:
        self.storage, self.keys = storage, keys

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> tuple[list[Any], list[Any]]:
        right, wrong, asked = self.keys[:4], self.keys[4:8], self.keys[8:10]
        self.storage.read_ahead(right)
        served = list(self.storage.read_many(right))
        self.storage.read_ahead(wrong)
        other = list(self.storage.read_many(asked))  # not the guess: the guess is dropped, these are fetched
        return served, other


@pytest.mark.timeout(120)
def test_read_ahead_fetches_once_and_a_wrong_guess_changes_nothing(
    s3: LocalS3, s3_image_folder: str, image_folder: Path
) -> None:
    keys = sorted(str(p.relative_to(image_folder)) for p in image_folder.rglob("*.jpg"))[:10]
    with fault_proxy(s3.endpoint, delay=0.05) as proxy:
        storage = ObjectStorage(s3_image_folder, s3.storage_options(proxy.endpoint))
        loader = DataLoader(AheadProbe(storage, keys), batch_size=None, num_workers=1)
        ((served, other),) = list(loader)
        log = [path for method, path, status in proxy.requests() if method == "GET"]
    assert served == [(image_folder / k).read_bytes() for k in keys[:4]]
    assert other == [(image_folder / k).read_bytes() for k in keys[8:10]]
    prefix = s3_image_folder.split("://", 1)[1]
    for k in keys[:4] + keys[8:10]:
        assert log.count(f"/{prefix}/{k}") == 1, k  # fetched once: the read-ahead's response was the one used
