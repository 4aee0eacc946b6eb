"""A node-local copy of an HDF5 file in a bucket: once per cache folder, resumable, replaced when the object changes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import torch

from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3_server import LocalS3, upload_folder
from lightning_fastdata import HDF5DataModule, convert_folder_to_hdf5
from lightning_fastdata.loading.storage.download import node_local_copy
from lightning_fastdata.loading.storage.object_store import main_process_is_clean

CHUNK = 8 << 10  # small, so that the test file spans many ranges


def upload_file(path: Path, s3: LocalS3, prefix: str) -> str:
    folder = path.parent / f"upload-{prefix}"
    folder.mkdir()
    (folder / path.name).write_bytes(path.read_bytes())
    upload_folder(folder, s3.url(prefix), s3.storage_options())
    return f"{s3.url(prefix)}/{path.name}"


def _copy(url: str, cache: str, options: dict, out: multiprocessing.Queue) -> None:
    out.put(str(node_local_copy(url, cache, options, chunk_bytes=CHUNK)))


def test_processes_of_one_node_download_once_and_reuse(s3: LocalS3, image_folder: Path, tmp_path: Path) -> None:
    h5 = convert_folder_to_hdf5(image_folder, tmp_path / "train.h5", mode="encoded", processes=1, progress=False)
    url = upload_file(h5, s3, "h5-once")
    with fault_proxy(s3.endpoint) as proxy:
        options = s3.storage_options(proxy.endpoint)
        ctx = multiprocessing.get_context("fork")
        out: multiprocessing.Queue = ctx.Queue()
        procs = [ctx.Process(target=_copy, args=(url, str(tmp_path / "cache"), options, out)) for _ in range(3)]
        for p in procs:
            p.start()
        paths = {out.get(timeout=120) for _ in procs}
        for p in procs:
            p.join(30)
        ranged = [r for m, _, _, r in proxy.requests_with_ranges() if m == "GET"]
    (copy,) = paths
    assert Path(copy).read_bytes() == h5.read_bytes()
    chunks = -(-h5.stat().st_size // CHUNK)
    assert len(ranged) == chunks, f"{len(ranged)} ranged GETs for {chunks} chunks: downloaded more than once"


def test_a_killed_download_resumes_and_a_changed_object_is_fetched_again(
    s3: LocalS3, image_folder: Path, tmp_path: Path
) -> None:
    h5 = convert_folder_to_hdf5(image_folder, tmp_path / "train.h5", mode="encoded", processes=1, progress=False)
    url = upload_file(h5, s3, "h5-resume")
    cache = tmp_path / "cache"
    copy = node_local_copy(url, cache, s3.storage_options(), chunk_bytes=CHUNK)
    # what a download killed after 3 chunks leaves: the partial prefix and its record, no copy
    partial = copy.with_name(f".{copy.name}.partial")
    partial.write_bytes(h5.read_bytes()[: 3 * CHUNK])
    copy.with_name(partial.name + ".json").write_text(copy.with_name(copy.name + ".source.json").read_text())
    copy.unlink()
    with fault_proxy(s3.endpoint) as proxy:
        again = node_local_copy(url, cache, s3.storage_options(proxy.endpoint), chunk_bytes=CHUNK)
        ranges = [r for m, _, _, r in proxy.requests_with_ranges() if m == "GET"]
    assert again == copy and again.read_bytes() == h5.read_bytes()
    starts = sorted(int(r.split("=")[1].split("-")[0]) for r in ranges)
    assert starts == list(range(3 * CHUNK, h5.stat().st_size, CHUNK))  # from where it stopped, not from 0
    # the object replaced in the bucket (another ETag): the copy is replaced too
    changed = tmp_path / "changed" / h5.name
    changed.parent.mkdir()
    changed.write_bytes(h5.read_bytes()[::-1])
    upload_folder(changed.parent, s3.url("h5-resume"), s3.storage_options())
    assert node_local_copy(url, cache, s3.storage_options(), chunk_bytes=CHUNK).read_bytes() == changed.read_bytes()
    assert not partial.exists()


def test_hdf5_module_from_a_bucket_matches_the_local_file(s3: LocalS3, image_folder: Path, tmp_path: Path) -> None:
    h5 = convert_folder_to_hdf5(image_folder, tmp_path / "train.h5", mode="encoded", processes=1, progress=False)
    url = upload_file(h5, s3, "h5-module")
    kw = dict(image_size=16, batch_size=8, num_workers=2, val_fraction=0.2)
    bucket = HDF5DataModule(url, cache_dir=str(tmp_path / "cache"), storage_options=s3.storage_options(), **kw)
    local = HDF5DataModule(str(h5), **kw)
    assert not (tmp_path / "cache").exists()  # __init__ downloads nothing: prepare_data does, once per node
    bucket.prepare_data()
    assert bucket.classes == local.classes and bucket.hparams["root"] == url
    for dm in (bucket, local):
        dm.setup("fit")
    got = list(bucket.train_dataloader())
    want = list(local.train_dataloader())
    assert len(got) == len(want) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want))
    assert main_process_is_clean()
