from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.fork_client import SERVER

from benchmarks.s3_server import LocalS3, local_s3_server, upload_folder
from lightning_fastdata.demos import make_image_folder, photo_like_image


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``cuda``-marked tests without a GPU (``pytest -m cuda`` selects them on a GPU machine)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU (scripts/gpu-check.sh runs these there); CPU tests cover the logic"
    )
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _threads_for_parallel_tests() -> Iterator[None]:
    """With several test processes (pytest-xdist), each process's torch (and its subprocesses') uses its share of
    the CPUs: torch's intra-op threads wait for each other spinning, so two processes of two threads on two CPUs
    ran the same checks 3x (one competing process) to 80x (the full suite) slower than one thread each."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        yield
        return
    threads, before = max(1, len(os.sched_getaffinity(0)) // workers), torch.get_num_threads()
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """Stop the fork server (``helpers/zygote.py``) that process-level tests share, if one was started."""
    yield
    SERVER.close()


@pytest.fixture(scope="session", autouse=True)
def _index_tiny_images() -> Iterator[None]:
    """Entropy indexes for the tests' tiny photos too (in this process and the processes it forks).

    By default a JPEG with fewer than 16 entropy-coded bytes per block gets none (its decode is too cheap for the
    index to pay), which leaves out most 96 x 72 test photos: the tests of the index's machinery would then test
    empty entries. ``test_entropy_index.py`` checks the default on files of each kind.
    """
    from lightning_fastdata.loading.jpeg import entropy_index

    default = entropy_index.INDEX_MIN_BYTES_PER_BLOCK
    entropy_index.INDEX_MIN_BYTES_PER_BLOCK = 0.0
    yield
    entropy_index.INDEX_MIN_BYTES_PER_BLOCK = default


@pytest.fixture(scope="session", autouse=True)
def _user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The per-user cache folder (default entropy indexes) in the session's temp folder, never the home's."""
    path = tmp_path_factory.mktemp("user-cache")
    before = os.environ.get("LIGHTNING_FASTDATA_CACHE")
    os.environ["LIGHTNING_FASTDATA_CACHE"] = str(path)
    yield path
    if before is None:
        os.environ.pop("LIGHTNING_FASTDATA_CACHE", None)
    else:
        os.environ["LIGHTNING_FASTDATA_CACHE"] = before


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 13 small photo-like JPEGs (39 images: odd, so last batches are partial)."""
    return make_image_folder(tmp_path_factory.mktemp("folder") / "train", num_classes=3, per_class=13, size=(96, 72))


@pytest.fixture(scope="session")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ImageNet-sized JPEG (large enough for DCT-domain downscaling at small outputs)."""
    path = tmp_path_factory.mktemp("photo") / "photo.jpg"
    photo_like_image(np.random.default_rng(0), 500, 375, hue=0.3).save(path, quality=90)
    return path


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    """A real S3 server (SeaweedFS) on 127.0.0.1, free ports, for the whole session; stopped by its PID."""
    with local_s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def s3_image_folder(s3: LocalS3, image_folder: Path) -> str:
    """``image_folder`` uploaded to ``s3://data/train``; returns the URL."""
    url = s3.url("train")
    upload_folder(image_folder, url, s3.storage_options())
    return url
