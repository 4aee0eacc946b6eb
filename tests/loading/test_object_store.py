"""Reading a bucket: a real S3 server (SeaweedFS on 127.0.0.1), retries and timeouts through a fault proxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3_server import LocalS3
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.storage.local import LocalStorage
from lightning_fastdata.loading.storage.object_store import ObjectStorage, main_process_is_clean
from lightning_fastdata.loading.storage.registry import open_storage


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.jpg"))


def test_reads_come_back_in_order_and_equal_the_files(s3: LocalS3, s3_image_folder: str, image_folder: Path) -> None:
    storage = ObjectStorage(s3_image_folder, s3.storage_options())
    keys = files(image_folder)[::-1]  # reversed: the order asked for, not the listing's
    got = list(storage.read_many(keys))
    assert got == [(image_folder / k).read_bytes() for k in keys]
    assert storage.stat(keys[0]).size == (image_folder / keys[0]).stat().st_size
    assert storage.list_prefixes() == sorted(p.name for p in image_folder.iterdir())
    # the test process (which forks loader workers) never started obstore's runtime: its helper process did
    assert main_process_is_clean()


def test_a_missing_object_is_an_error_naming_its_url(s3: LocalS3, s3_image_folder: str) -> None:
    storage = ObjectStorage(s3_image_folder, s3.storage_options())
    (err,) = storage.read_many(["class_000/nope.jpg"])
    assert isinstance(err, FileNotFoundError)
    assert str(err) == f"{s3_image_folder}/class_000/nope.jpg does not exist in the bucket."
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        storage.stat("class_000/nope.jpg")


def test_the_standard_environment_configures_the_store(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    key = files(image_folder)[0]
    assert list(ObjectStorage(s3_image_folder).read_many([key])) == [(image_folder / key).read_bytes()]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    (err,) = ObjectStorage(s3_image_folder, {"max_retries": 0}).read_many([key])
    assert isinstance(err, OSError) and s3_image_folder in str(err)


def test_the_environment_of_the_process_that_made_the_storage_is_the_one_read(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper process that makes the calls starts once; variables set after it started still configure a
    storage made later (passed to obstore, not written into any process's environment), and options beat them."""
    key = files(image_folder)[0]
    for name in s3.env():
        monkeypatch.delenv(name, raising=False)
    assert list(ObjectStorage(s3_image_folder, s3.storage_options()).read_many([key]))  # the helper is running
    before = dict(os.environ)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    assert list(ObjectStorage(s3_image_folder).read_many([key])) == [(image_folder / key).read_bytes()]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    (err,) = ObjectStorage(s3_image_folder, {"max_retries": 0}).read_many([key])
    assert isinstance(err, PermissionError) and "AWS_ACCESS_KEY_ID" in str(err)
    # a pair in storage_options replaces the environment's pair, under either of obstore's names
    options = s3.storage_options()
    pair = {
        "aws_access_key_id": options.pop("access_key_id"),
        "aws_secret_access_key": options.pop("secret_access_key"),
    }
    assert list(ObjectStorage(s3_image_folder, {**options, **pair}).read_many([key]))
    monkeypatch.undo()
    assert dict(os.environ) == before  # nothing of ours wrote to it


def test_the_environment_table_is_obstores_own() -> None:
    """Every variable obstore's stubs document for a configuration key is in the table with that key."""
    import ast
    import re

    import obstore

    from lightning_fastdata.loading.storage.obstore_calls import ENV_CONFIG, config_from_env

    stubs = Path(obstore.__file__).parent / "_store"
    for scheme, (stub, name) in {"s3": ("_aws.pyi", "S3Config"), "gs": ("_gcs.pyi", "GCSConfig"),
                                 "az": ("_azure.pyi", "AzureConfig")}.items():  # fmt: skip
        (cls,) = [n for n in ast.parse((stubs / stub).read_text()).body if getattr(n, "name", "") == name]
        documented = {}
        for field, doc in zip(cls.body, cls.body[1:]):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(doc, ast.Expr)
                and "**Environment variable" in str(getattr(doc.value, "value", ""))
            ):
                text = str(doc.value.value).split("**Environment variable", 1)[1]  # type: ignore[attr-defined]
                documented.update(dict.fromkeys(re.findall(r"`([A-Z0-9_]+)`", text), field.target.id))  # type: ignore[union-attr]
        documented = {var: key for var, key in documented.items() if key not in ("bucket", "container_name")}
        assert ENV_CONFIG[scheme] == documented, scheme
    env = {"AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "S", "AWS_PROFILE": "p"}
    assert config_from_env("s3://b/p", env, {}) == {
        "access_key_id": "AK",
        "secret_access_key": "S",
        "region": "eu-west-1",
    }
    assert config_from_env("s3://b/p", env, {"aws_region": "x", "access_key_id": "O"}) == {}
    assert config_from_env("gs://b/p", env, {}) == {}


def test_throttling_is_retried_with_backoff(s3: LocalS3, s3_image_folder: str, image_folder: Path) -> None:
    keys = files(image_folder)[:8]
    with fault_proxy(s3.endpoint, slowdown={keys[3]: 2}) as proxy:
        storage = ObjectStorage(s3_image_folder, s3.storage_options(proxy.endpoint))
        assert list(storage.read_many(keys)) == [(image_folder / k).read_bytes() for k in keys]
        answers = [status for _, path, status in proxy.requests() if path.endswith(keys[3])]
    assert answers == [503, 503, 200]


def test_a_stalled_request_is_cut_at_the_timeout_and_retried(
    s3: LocalS3, s3_image_folder: str, image_folder: Path
) -> None:
    keys = files(image_folder)[:8]
    with fault_proxy(s3.endpoint, stall={keys[5]: 20.0}) as proxy:
        storage = ObjectStorage(s3_image_folder, s3.storage_options(proxy.endpoint, timeout=1))
        start = time.perf_counter()
        got = list(storage.read_many(keys))
        took = time.perf_counter() - start
    assert got == [(image_folder / k).read_bytes() for k in keys]
    assert took < 10, f"one stalled object held the batch {took:.1f} s (timeout 1 s, stall 20 s)"


def test_a_body_cut_mid_transfer_is_fetched_again_within_the_timeout(
    s3: LocalS3, s3_image_folder: str, image_folder: Path
) -> None:
    """Headers and half the body, then silence: the client cuts it at the timeout and fetches the rest again."""
    keys = files(image_folder)[:8]
    with fault_proxy(s3.endpoint, stall_body={keys[4]: 8.0}) as proxy:
        storage = ObjectStorage(s3_image_folder, s3.storage_options(proxy.endpoint, timeout=1))
        start = time.perf_counter()
        got = list(storage.read_many(keys))
        took = time.perf_counter() - start
        again = [r for m, p, _, r in proxy.requests_with_ranges() if m == "GET" and p.endswith(keys[4])]
    assert got == [(image_folder / k).read_bytes() for k in keys]
    assert took < 5, f"the cut body held the batch {took:.1f} s (timeout 1 s, stall 8 s)"
    # the whole object first (its answer stalled halfway), then a request for the rest
    size = (image_folder / keys[4]).stat().st_size
    assert len(again) == 2 and again[0] == "-", again
    assert again[1].startswith("bytes=") and again[1].endswith(f"-{size - 1}"), again


@pytest.mark.slow
def test_an_object_that_keeps_failing_fails_alone_within_the_retry_budget(
    s3: LocalS3, s3_image_folder: str, image_folder: Path
) -> None:
    keys = files(image_folder)[:6]
    with fault_proxy(s3.endpoint, slowdown={keys[2]: 1000}) as proxy:
        storage = ObjectStorage(s3_image_folder, s3.storage_options(proxy.endpoint, max_retries=2, retry_timeout=5))
        start = time.perf_counter()
        got = list(storage.read_many(keys))
        took = time.perf_counter() - start
    assert isinstance(got[2], OSError) and keys[2] in str(got[2])
    assert [g for i, g in enumerate(got) if i != 2] == [
        (image_folder / k).read_bytes() for i, k in enumerate(keys) if i != 2
    ]
    assert took < 10


def test_bad_settings_fail_at_construction_naming_them(s3: LocalS3, tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="bogus"):
        ObjectStorage(s3.url("x"), {"bogus": "1"})
    with pytest.raises(InvalidValueError, match="max_inflight"):
        ObjectStorage(s3.url("x"), {"max_inflight": 0})
    with pytest.raises(InvalidValueError, match="storage_options"):
        open_storage(str(tmp_path), {"endpoint": "http://127.0.0.1:1"})
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)


def test_loader_workers_read_the_bucket_themselves(s3: LocalS3, s3_image_folder: str, image_folder: Path) -> None:
    """Forked loader workers (the main process never ran obstore) fetch concurrently in their own process."""
    from torch.utils.data import DataLoader, Dataset

    class Pids(Dataset):
        def __init__(self, storage: ObjectStorage, keys: list[str]) -> None:
            self.storage, self.keys = storage, keys

        def __len__(self) -> int:
            return len(self.keys)

        def __getitem__(self, i: int) -> tuple[int, bytes]:
            (data,) = self.storage.read_many([self.keys[i]])
            assert isinstance(data, bytes)
            return os.getpid(), data

    keys = files(image_folder)
    loader = DataLoader(
        Pids(ObjectStorage(s3_image_folder, s3.storage_options()), keys),
        batch_size=4,
        num_workers=2,
        collate_fn=lambda rows: rows,
        multiprocessing_context="fork",
    )
    rows = [row for batch in loader for row in batch]
    assert [data for _, data in rows] == [(image_folder / k).read_bytes() for k in keys]
    assert os.getpid() not in {pid for pid, _ in rows} and len({pid for pid, _ in rows}) == 2
    assert main_process_is_clean()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_reading_process_keeps_max_inflight_requests_in_flight_and_exits_with_one_pending(
    s3: LocalS3, s3_image_folder: str, image_folder: Path, tmp_path: Path
) -> None:
    """In a process that reads directly (a loader worker's case), requests overlap up to ``max_inflight``, never more.

    Through a proxy that holds each request 0.1 s: 12 reads with 3 in flight take 4 rounds (>= 0.4 s; more in
    flight would be faster), far less than one at a time (1.2 s). A read-ahead still waiting for a stalled object
    does not hold up the process's exit (its request threads are daemons).
    """
    script = tmp_path / "read.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, threading, time
            from lightning_fastdata.loading.storage import object_store
            object_store.allow_direct_calls()
            url, options, keys, stalled = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
            storage = object_store.ObjectStorage(url, options)
            storage.stat(keys[0])  # the connection and the store are made before the clock starts
            start = time.perf_counter()
            got = list(storage.read_many(keys))
            took = time.perf_counter() - start
            threads = sum(t.name == "fastdata-object-store" for t in threading.enumerate())
            storage.read_ahead([stalled])  # stalled 30 s by the proxy; never read
            time.sleep(0.3)
            print(json.dumps({"took": took, "threads": threads, "sizes": [len(g) for g in got]}), flush=True)
            """
        )
    )
    keys = files(image_folder)[:12]
    stalled = files(image_folder)[12]
    with fault_proxy(s3.endpoint, delay=0.1, stall={stalled: 30.0}) as proxy:
        options = s3.storage_options(proxy.endpoint, max_inflight=3)
        args = [sys.executable, str(script), s3_image_folder, json.dumps(options), json.dumps(keys), stalled]
        start = time.perf_counter()
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        ran = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["sizes"] == [(image_folder / k).stat().st_size for k in keys]
    assert report["threads"] == 3
    assert 0.38 <= report["took"] < 1.2, report
    assert ran < 25, f"the process took {ran:.1f} s to end with a read-ahead stalled 30 s"


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an orphan's zombie may wait for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_the_helper_survives_freeing_shared_memory_tensors_it_inherited(
    s3: LocalS3, s3_image_folder: str, tmp_path: Path
) -> None:
    """A shared-memory tensor the parent held when the helper was forked can be freed in the helper.

    torch keeps such a tensor's file descriptor open and aborts the process (``could not close file descriptor``)
    if it was closed underneath: the helper used to close every inherited descriptor, and its first garbage
    collection of an inherited tensor (a loader's batch) killed it, failing every later bucket call.
    """
    script = tmp_path / "inherit.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, json, sys
            import torch
            from lightning_fastdata.loading.storage import object_store
            def collect(store):
                return gc.collect() >= 0

            gc.disable()
            tensor = torch.zeros(4096)
            tensor.share_memory_()  # file_descriptor strategy: the storage keeps its descriptor open
            cycle = [tensor]
            cycle.append(cycle)
            del tensor, cycle  # garbage that only the collector frees: still there when the helper is forked
            storage = object_store.ObjectStorage(sys.argv[1], json.loads(sys.argv[2]))
            print(storage.run_direct(collect), storage.list_prefixes(), flush=True)
            """
        )
    )
    args = [sys.executable, str(script), s3_image_folder, json.dumps(s3.storage_options())]
    done = subprocess.run(args, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "could not close file descriptor" not in done.stderr
    assert done.stdout.startswith("True ['class_"), done.stdout


@pytest.mark.timeout(120)
def test_the_helper_process_ends_when_the_process_it_serves_is_killed(
    s3: LocalS3, s3_image_folder: str, tmp_path: Path
) -> None:
    # a training process killed by SIGKILL (preemption) must not leave its object-store helper behind
    script = tmp_path / "serve.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            from lightning_fastdata.loading.storage import object_store
            storage = object_store.ObjectStorage(sys.argv[1], json.loads(sys.argv[2]))
            storage.list_prefixes()  # the first call starts the helper
            print(object_store.helper().process.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    args = [sys.executable, str(script), s3_image_folder, json.dumps(s3.storage_options())]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        helper = int(proc.stdout.readline())  # type: ignore[union-attr]
        assert _running(helper)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    while _running(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(helper), f"the helper {helper} outlived the killed process"


@pytest.mark.timeout(120)
def test_the_helper_holds_none_of_its_parents_pipes(s3: LocalS3, s3_image_folder: str, tmp_path: Path) -> None:
    """A pipe the program opened before the helper started still reaches EOF when the program closes it.

    Forked with every descriptor of its parent, the helper held the write end of the pipe to a subprocess's stdin,
    and the subprocess waited for EOF as long as the helper lived (the test suite's fork server did).
    """
    script = tmp_path / "pipe.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, subprocess, sys
            from lightning_fastdata.loading.storage import object_store
            reader = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); print('eof')"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            storage = object_store.ObjectStorage(sys.argv[1], json.loads(sys.argv[2]))
            storage.list_prefixes()  # the first call forks the helper, while the pipe is open
            reader.stdin.close()
            reader.wait(timeout=20)  # TimeoutExpired while anything else holds the pipe's write end
            print(reader.stdout.read().strip(), flush=True)
            """
        )
    )
    args = [sys.executable, str(script), s3_image_folder, json.dumps(s3.storage_options())]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "eof", out.stderr[-2000:]


@pytest.mark.timeout(120)
def test_wrong_credentials_and_a_missing_bucket_name_the_url_and_the_credentials_never_the_secret(
    s3: LocalS3, s3_image_folder: str
) -> None:
    wrong = s3.storage_options(secret_access_key="not-the-secret-at-all", max_retries=0)
    with pytest.raises(PermissionError) as refused:
        ObjectStorage(s3_image_folder, wrong).list_prefixes()
    message = str(refused.value)
    assert s3_image_folder in message and "storage_options (access key id fast...)" in message
    assert "not-the-secret-at-all" not in message and s3.secret_access_key not in message
    missing = s3_image_folder.replace(f"s3://{s3.bucket}/", "s3://no-such-bucket-here/")
    with pytest.raises(OSError) as absent:
        ObjectStorage(missing, s3.storage_options(max_retries=0)).list_prefixes()
    assert missing in str(absent.value) and s3.secret_access_key not in str(absent.value)


@pytest.mark.timeout(60)
def test_the_fault_proxy_ends_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    # a benchmark or test run SIGKILLed mid-way must not leave its latency proxy serving forever
    script = tmp_path / "proxy.py"
    script.write_text(
        "import time\nfrom benchmarks.fault_proxy import fault_proxy\n"
        f"with fault_proxy('http://127.0.0.1:9', log_dir={str(tmp_path)!r}) as p:\n"  # killed: no clean-up of its own
        "    print(p.pid, flush=True)\n    time.sleep(600)\n"
    )
    lab = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}  # the proxy is the checkout's (benchmarks/)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=lab)
    try:
        proxy = int(proc.stdout.readline())  # type: ignore[union-attr]
        assert _running(proxy)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _running(proxy) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(proxy), f"the proxy {proxy} outlived the killed process"
