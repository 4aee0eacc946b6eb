"""Shards in a bucket (issue 62), on a real S3 server: tar members and Parquet row groups read in place by ranged
requests through loader workers, the same batches as the local shards; indexes kept locally; an object rewritten
after indexing is refused, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.s3_server import LocalS3, upload_folder
from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards
from lightning_fastdata.errors import DataError

_UPLOADED: dict[str, str] = {}


@pytest.fixture(scope="module")
def shard_sets(image_folder: Path, tmp_path_factory: pytest.TempPathFactory, s3: LocalS3) -> dict[str, tuple]:
    """Each format's local folder and its copy in the bucket."""
    root = tmp_path_factory.mktemp("bucket-shards")
    tar = write_tar_shards(image_folder, root / "tar", shard_bytes=20_000)[0].parent
    parquet = write_parquet_shards(image_folder, root / "parquet", shard_bytes=25_000, rows_per_group=5)[0].parent
    out = {}
    for name, folder in (("tar", tar), ("parquet", parquet)):
        url = s3.url(f"shards-{name}")
        upload_folder(folder, url, s3.storage_options())
        out[name] = (folder, url)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_shards_in_a_bucket_serve_the_local_shards_batches_through_workers(
    shard_sets: dict[str, tuple], s3: LocalS3, tmp_path: Path, fmt: str
) -> None:
    from lightning_fastdata import ShardDataModule

    folder, url = shard_sets[fmt]
    kw = dict(image_size=16, batch_size=8, num_workers=2, val_fraction=0.2, seed=1, shuffle_buffer=10)
    kw["block_bytes"] = None  # tar members one request each: the local shards' global shuffle (blocks: below)
    local = ShardDataModule(str(folder), index_dir=str(tmp_path / "local"), **kw)
    remote = ShardDataModule(url + "/", index_dir=str(tmp_path / "remote"), storage_options=s3.storage_options(), **kw)
    assert remote.format == fmt and remote.classes == local.classes == ("class_000", "class_001", "class_002")
    assert all(p.startswith("s3://") for p in remote.shard_paths) and len(remote.shard_paths) > 2
    for dm in (local, remote):
        dm.setup("fit")
    kept = sorted((tmp_path / "remote").rglob("*.npz"))
    assert len(kept) == len(remote.shard_paths)  # each shard's index, kept on the local disk
    for a, b in zip([list(local.train_dataloader()), list(local.val_dataloader())],
                    [list(remote.train_dataloader()), list(remote.val_dataloader())]):  # fmt: skip
        assert len(a) == len(b) > 0
        assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    # without workers the reads go through the helper process: the same batches again
    remote.num_workers = 0
    first = next(iter(remote.val_dataloader()))
    assert torch.equal(first[0], next(iter(local.val_dataloader()))[0])


@pytest.mark.timeout(300)
def test_tar_shards_in_a_bucket_are_read_in_runs_of_members_shuffled_in_windows(
    shard_sets: dict[str, tuple], s3: LocalS3, tmp_path: Path
) -> None:
    """block_bytes: a run of members is one request; training shuffles windows of runs (every sample once an epoch,
    through 2 workers), validation reads its runs in order: the local shards' validation batches bit for bit; the
    shards' entropy index is built from the bucket."""
    from collections import Counter

    from lightning_fastdata import ShardDataModule

    folder, url = shard_sets["tar"]
    kw = dict(image_size=16, batch_size=8, num_workers=2, val_fraction=0.2, seed=1, shuffle_buffer=8)
    from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available

    indexed = entropy_index_available()  # the shards' entropy index, built from the bucket by ranged reads
    remote = ShardDataModule(url, index_dir=str(tmp_path / "r"), storage_options=s3.storage_options(),
                             block_bytes=6_000, entropy_index=indexed, **kw)  # fmt: skip
    local = ShardDataModule(str(folder), index_dir=str(tmp_path / "l"), entropy_index=False, **kw)
    remote.prepare_data()
    for dm in (remote, local):
        dm.setup("fit")
    train = remote.train_dataset
    if indexed:
        assert all(train.entropy_index_of(i) for i in range(len(train)))  # type: ignore[union-attr]
    assert train.block_reads and train.windows is not None  # type: ignore[union-attr]
    runs = len(set(train._group_of.tolist()))  # type: ignore[union-attr]
    assert len(train) > runs > len(remote.shard_paths)  # several members a run, several runs a shard
    labels = Counter(int(x) for _, batch in remote.train_dataloader() for x in batch)
    assert labels == Counter(train.targets.tolist())  # type: ignore[union-attr]
    a, b = list(remote.val_dataloader()), list(local.val_dataloader())
    assert len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_shard_rewritten_in_the_bucket_after_indexing_is_refused_naming_it(
    image_folder: Path, s3: LocalS3, tmp_path: Path, fmt: str
) -> None:
    from lightning_fastdata import ShardDataModule

    if fmt == "tar":
        folder = write_tar_shards(image_folder, tmp_path / "a", shard_bytes=25_000)[0].parent
        other = write_tar_shards(image_folder, tmp_path / "b", shard_bytes=10**9)[0].parent
    else:
        folder = write_parquet_shards(image_folder, tmp_path / "a", shard_bytes=25_000, rows_per_group=5)[0].parent
        other = write_parquet_shards(image_folder, tmp_path / "b", shard_bytes=10**9)[0].parent
    assert len(list(folder.iterdir())) > 2  # the first of several shards, rewritten as the one of all samples
    url = s3.url(f"rewritten-{fmt}")
    upload_folder(folder, url, s3.storage_options())
    dm = ShardDataModule(url, index_dir=str(tmp_path / "idx"), storage_options=s3.storage_options(), image_size=16,
                         batch_size=39, val_fraction=0.0, num_workers=0, shuffle=False)  # fmt: skip
    dm.setup("fit")
    name = f"shard-000000.{fmt}"
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / name).write_bytes((other / name).read_bytes())
    upload_folder(tmp_path / "up", url, s3.storage_options())
    with pytest.raises(DataError, match=rf"{name}' changed after it was indexed"):
        next(iter(dm.train_dataloader()))


def test_bucket_patterns_are_listed_once_and_expanded_in_order(shard_sets: dict[str, tuple], s3: LocalS3) -> None:
    from lightning_fastdata.datamodules.shards import expand_shards

    folder, url = shard_sets["tar"]
    names = sorted(p.name for p in Path(folder).glob("*.tar"))
    options = s3.storage_options()
    assert expand_shards(url, options) == [f"{url}/{n}" for n in names]
    braces = f"{url}/shard-{{000000..{len(names) - 1:06d}}}.tar"
    assert expand_shards(braces, options) == [f"{url}/{n}" for n in names]
    assert expand_shards(f"{url}/shard-00000[01].tar", options) == [f"{url}/{n}" for n in names[:2]]
    with pytest.raises(FileNotFoundError, match=r"The shard 's3://.*shard-000998\.tar' does not exist"):
        expand_shards(f"{url}/shard-{{000998..000999}}.tar", options)
    with pytest.raises(ValueError, match="all local or all in a bucket"):
        expand_shards([str(folder), url], options)
