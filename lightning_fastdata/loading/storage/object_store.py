"""Objects in a bucket (S3 and S3-compatible servers, GCS, Azure) read through ``obstore``.

Chosen by measurement (``benchmarks/s3_clients.py``): obstore served 4.6x the requests per second of boto3 and
5.6x those of s3fs with 32 requests in flight, at a fifth of their CPU per request.

**Configuration** comes from the environment as the AWS tools read it (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, instance roles; with
``AWS_PROFILE`` set and ``boto3`` installed, the profile through boto3), the GCS and Azure equivalents, and
``storage_options``: obstore's configuration keys (``endpoint``, ``access_key_id``, ``secret_access_key``,
``region``, ...) plus this package's ``max_inflight``, ``timeout``, ``connect_timeout``, ``max_retries`` and
``retry_timeout`` (seconds). An ``http://`` endpoint (a local test server) is allowed without further setting.

**Retries and timeouts: an outage costs a pause, not the job.** Throttling (``503 SlowDown``), other 5xx answers,
refused or dropped connections and timeouts are retried: first up to ``max_retries`` times quickly by obstore
(backoff from 0.1 s), then again and again with exponential backoff (0.25 s doubling to 5 s, with jitter) until
``retry_timeout`` seconds (default 60) have passed since the first attempt; each attempt is cut at ``timeout``. So
a server that restarts, a network blip or a burst of throttling shorter than ``retry_timeout`` pauses the reads and
the same bytes arrive after it; one that lasts longer fails the read with a
:class:`~lightning_fastdata.errors.StorageError` naming the URL, how long it was retried and the last answer, which
the datasets raise whatever ``on_corrupt`` says (a failed read is not a corrupt image). A missing object, a refused
credential or a missing bucket is not retried.

**Objects rewritten during a run** are served as they are now: the key names the sample. Where the listing saw
another size or ETag than the read gets, the object changed after the listing: :meth:`ObjectStorage.read_many`
reports it to its caller, and the folder dataset names its URL in one warning per run (up to ten objects): a
resume state or an entropy index of the old listing describes other bytes.

**Processes.** obstore runs a tokio runtime, which does not survive ``fork`` (obstore#441: a child forked after
the parent used it hangs at its first request). So the process that starts DataLoader workers never starts it:
there, every call is made by a helper process forked once, on first use, from this clean process
(:mod:`~lightning_fastdata.loading.storage.object_store_helper`; its answers cross a pipe). Loader workers and
build-pool processes, which fork nothing, call obstore directly, each with its own runtime, request threads and
connections.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np

from lightning_fastdata.errors import InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.index.files import FileIndex, is_image_name
from lightning_fastdata.loading.index.store import IndexLookup
from lightning_fastdata.loading.storage.base import ObjectStat, is_url, join_url
from lightning_fastdata.loading.storage.bucket_index import (
    DEFAULT_INDEX_TTL,
    bucket_classes,
    indexed_bucket,
    list_bucket_folder,
    object_version,
)
from lightning_fastdata.loading.storage.object_store_helper import (
    allow_direct_calls,
    direct_calls_allowed,
    first_line,
    helper,
)
from lightning_fastdata.loading.storage.obstore_calls import (
    as_os_error,
    config_from_env,
    get_object,
    get_object_range,
    list_prefix,
    profile_credentials,
)
from lightning_fastdata.loading.storage.retry import retried

__all__ = ["ObjectStorage", "allow_direct_calls", "main_process_is_clean"]

T = TypeVar("T")

#: This package's own settings in ``storage_options`` and their defaults.
DEFAULTS: dict[str, Any] = {
    "max_inflight": 32,
    "timeout": 10.0,
    "connect_timeout": 5.0,
    "max_retries": 4,
    "retry_timeout": 60.0,
}

_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")


def _direct() -> bool:
    if direct_calls_allowed():
        return True
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def main_process_is_clean() -> bool:
    """Whether this process has no tokio runtime thread (so forked loader workers can use obstore)."""
    try:
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    except OSError:
        return True  # no /proc: cannot tell
    return not any(name.startswith("tokio") for name in names)


class _Session:
    """This process's store and its request threads (one per process and storage).

    Each request is one blocking obstore call (``get`` and its body, or a listing) made by one of at most
    ``max_inflight`` daemon threads, so that many are in flight, and each takes one thread hand-over. (Before, an
    asyncio loop thread awaited ``get_async``: per object a cross-thread submission, a wake-up of that loop and a
    hand-over back: 0.135 ms of client CPU per 87 KB object against 0.096 now, 0.22 against 0.17 with 20 ms per
    request, on one core: ``benchmarks/s3_reads.py``.)
    Daemon threads, so that a pending read-ahead never holds up a worker's exit; only processes that end with
    ``os._exit`` (loader workers, pool processes, the helper) make these calls.
    """

    def __init__(self, storage: ObjectStorage) -> None:
        self.store = storage.make_store()
        self.max_inflight = storage.max_inflight
        self.ahead: tuple[Any, list[Future[Any]]] | None = None  # read_ahead's batch: (its requests, their futures)
        self.jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self.threads = 0
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a request thread (first come, first served); its future can be cancelled until then."""
        future: Future[T] = Future()
        self.jobs.put((future, fn, args))
        with self.lock:
            if self.idle == 0 and self.threads < self.max_inflight:  # a new thread only when none is waiting
                self.threads += 1
                threading.Thread(target=self._serve, daemon=True, name="fastdata-object-store").start()
            else:
                self.idle -= 1  # a waiting thread (or the next to finish) takes it: the next submit cannot count on it
        return future

    def _serve(self) -> None:
        while True:
            future, fn, args = self.jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as err:  # noqa: BLE001 - handed to the reader of the future
                    future.set_exception(err)
            with self.lock:
                self.idle += 1


class ObjectStorage:
    """A bucket prefix as a :class:`~lightning_fastdata.loading.storage.base.Storage` (see the module docstring).

    Args:
        root: URL of the prefix, e.g. ``s3://bucket/imagenet/train``.
        storage_options: obstore configuration keys and this package's settings (module docstring);
            ``None``: the environment only.

    Raises:
        ValueError: If the URL or a setting is invalid (the message names it).
        ModuleNotFoundError: If ``obstore`` is not installed.
    """

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        if not is_url(root):
            raise InvalidValueError(f"{root!r} is not an object-store URL (s3://, gs://, az://).")
        try:
            import obstore  # noqa: F401 - checked here, used in the reading processes
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                f"Reading {root!r} needs obstore. Run `pip install 'lightning-fastdata[s3]'` (or `pip install "
                "obstore`)."
            ) from None
        self.root = root.rstrip("/")
        options = dict(storage_options or {})
        ours = {k: options.pop(k) for k in list(options) if k in DEFAULTS}
        try:
            settings = {k: type(v)(ours.get(k, v)) for k, v in DEFAULTS.items()}
        except (TypeError, ValueError) as err:
            raise InvalidValueError(f"storage_options {ours!r}: {err}; {list(DEFAULTS)} take numbers.") from None
        if settings["max_inflight"] < 1 or min(settings[k] for k in ("timeout", "connect_timeout")) <= 0:
            raise InvalidValueError(
                f"storage_options {ours!r}: max_inflight, timeout and connect_timeout should be positive."
            )
        self.max_inflight = int(settings["max_inflight"])
        self.settings = settings
        self.options = options
        # the environment as it is now, passed to obstore where the store is made (the helper process may be older)
        self.env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
        self._sessions: dict[int, _Session] = {}
        self.make_store()  # validates the URL and the options now, without any request

    remote = True
    """Reads wait on a network, so loaders fetch the next batch ahead; a listing has no folder mtimes to check."""

    def __repr__(self) -> str:
        return f"ObjectStorage({self.root!r})"

    # -- listing (the Storage contract; see lightning_fastdata.loading.storage.bucket_index) --------------------
    def list_classes(self) -> tuple[str, ...]:
        """The class prefixes directly under the root, sorted.

        Raises:
            FileNotFoundError: If there is none.
        """
        return bucket_classes(self)

    def list_files(self, classes: Sequence[str] | None = None) -> FileIndex:
        """``root/<class>/**/<image>`` in torchvision's order, with each object's size and ETag as its version."""
        return list_bucket_folder(self, classes)[0]

    def list_images(self) -> FileIndex:
        """Every image object under the prefix at any depth, sorted by key, with its size and ETag as its version."""
        entries = sorted((e for e in self.list_many([""])[0] if is_image_name(e.key)), key=lambda e: e.key)
        if not entries:
            raise PathNotFoundError(f"Found no image under {self.url('')!r} (at any depth).")
        versions = np.array([object_version(e.size, e.version) for e in entries], dtype=np.uint64)
        return FileIndex.of_paths(self.root, [e.key for e in entries], versions)

    def indexed(
        self,
        classes: Sequence[str],
        index_dir: str | os.PathLike[str] | None = None,
        index_ttl: float = DEFAULT_INDEX_TTL,
    ) -> tuple[FileIndex, IndexLookup]:
        """The listing, reused from ``index_dir`` within ``index_ttl`` seconds of when it was made, else listed."""
        return indexed_bucket(self, classes, index_dir, index_ttl)

    def content_fingerprint(self, index: FileIndex) -> str:
        """A fresh listing's per-class digests of every object's key, size and ETag (a rewrite changes it)."""
        return json.dumps(list_bucket_folder(self, index.classes)[1], sort_keys=True)

    def location(self) -> str:
        """The root URL."""
        return self.root

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sessions": {}}

    def credential_source(self) -> str:
        """Where this store's credentials come from, for error messages: never a secret (a key id's first 4 chars)."""
        for key, source in (("access_key_id", "storage_options"), ("aws_access_key_id", "storage_options")):
            if self.options.get(key):
                return f"{source} (access key id {str(self.options[key])[:4]}...)"
        if self.env.get("AWS_ACCESS_KEY_ID"):
            return f"the environment's AWS_ACCESS_KEY_ID ({self.env['AWS_ACCESS_KEY_ID'][:4]}...)"
        if self.env.get("AWS_PROFILE"):
            return f"AWS_PROFILE={self.env['AWS_PROFILE']}"
        return "none found in storage_options or the environment (an instance role, if any, or anonymous)"

    def url(self, relpath: str) -> str:
        """The object's URL."""
        return join_url(self.root, relpath)

    def make_store(self) -> Any:
        """A new obstore store for :attr:`root` (no request is made).

        Raises:
            ValueError: On an unknown setting or an unusable URL.
        """
        from obstore.exceptions import BaseError
        from obstore.store import from_url

        options = {**config_from_env(self.root, self.env, self.options), **self.options}
        endpoint = str(options.get("endpoint") or options.get("aws_endpoint") or "")
        client: dict[str, Any] = {
            "timeout": timedelta(seconds=self.settings["timeout"]),
            "connect_timeout": timedelta(seconds=self.settings["connect_timeout"]),
        }
        if endpoint.startswith("http://"):
            client["allow_http"] = True
        retry = {
            "max_retries": int(self.settings["max_retries"]),
            "retry_timeout": timedelta(seconds=self.settings["retry_timeout"]),
            "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
        }
        kwargs: dict[str, Any] = {"client_options": client, "retry_config": retry}
        credentials = {"access_key_id", "secret_access_key", "aws_access_key_id", "aws_secret_access_key"}
        if self.root.startswith(("s3://", "s3a://")) and self.env.get("AWS_PROFILE") and not credentials & set(options):
            kwargs["credential_provider"] = profile_credentials(self.env["AWS_PROFILE"])
        try:
            return from_url(self.root, **kwargs, **options)
        except (BaseError, ValueError, TypeError) as err:
            raise InvalidValueError(
                f"Cannot use {self.root!r} with storage_options {sorted(self.options)} and the environment's "
                f"{sorted(self.env) or 'nothing'}: {first_line(err)}"
            ) from None

    # -- the calls, made here or by the helper process --------------------------------------------------------
    def _session(self) -> _Session:
        session = self._sessions.get(os.getpid())
        if session is None:
            session = self._sessions[os.getpid()] = _Session(self)
        return session

    def _call(self, name: str, *args: Any) -> Any:
        if _direct():
            return getattr(self, name)(*args)
        return helper().call(_call_method, self, name, args)

    def read_many(
        self,
        relpaths: Sequence[str],
        versions: Sequence[int] | None = None,
        on_changed: Callable[[int], None] | None = None,
        ranges: Sequence[tuple[int, int]] | None = None,
    ) -> Iterator[bytes | OSError]:
        """Yield each object's bytes (or its ``OSError``) in order, fetching up to ``max_inflight`` at once.

        ``versions``: each object's size and ETag as listed (``versions`` of a
        :class:`~lightning_fastdata.FileIndex`); ``on_changed(k)`` is called, in this process, for each object ``k``
        read with another one: it changed since the listing (module docstring). ``ranges``: read only bytes
        ``[start, end)`` of each object (a tar shard's member), one ranged request each.
        """
        ranged = None if ranges is None else [(int(a), int(b)) for a, b in ranges]
        fetched = (
            helper().call(_call_method, self, "_read_all", (list(relpaths), ranged))
            if not _direct()
            else self._fetch(relpaths, ranged)
        )
        for k, (data, version) in enumerate(fetched):
            if on_changed is not None and versions is not None and version is not None and version != versions[k]:
                on_changed(k)
            yield data

    def _submit_reads(
        self, session: _Session, relpaths: Sequence[str], ranges: Sequence[tuple[int, int]] | None
    ) -> list[Future[tuple[bytes, int]]]:
        budget = self.settings["retry_timeout"]
        if ranges is None:
            return [session.submit(retried, budget, get_object, session.store, rel) for rel in relpaths]
        return [
            session.submit(retried, budget, get_object_range, session.store, rel, a, b)
            for rel, (a, b) in zip(relpaths, ranges)
        ]

    def _fetch(
        self, relpaths: Sequence[str], ranges: Sequence[tuple[int, int]] | None = None
    ) -> Iterator[tuple[bytes | OSError, int | None]]:
        """Each object's bytes (or ``OSError``) and read version, in order, as they arrive (a direct process)."""
        session = self._session()
        ahead, session.ahead = session.ahead, None
        wanted = (tuple(relpaths), None if ranges is None else tuple(ranges))
        if ahead is not None and ahead[0] == wanted:
            futures = ahead[1]  # fetched ahead by read_ahead: already arriving
        else:
            for future in ahead[1] if ahead is not None else ():
                future.cancel()  # a wrong guess: its requests that already started finish unread
            futures = self._submit_reads(session, relpaths, ranges)
        try:
            for rel, future in zip(relpaths, futures):
                try:
                    yield future.result()
                except Exception as err:  # noqa: BLE001 - any client error becomes the sample's OSError
                    yield as_os_error(err, self.url(rel), self.credential_source()), None
        finally:
            for future in futures:
                future.cancel()

    def read_ahead(self, relpaths: Sequence[str], ranges: Sequence[tuple[int, int]] | None = None) -> None:
        """Start fetching ``relpaths`` now (the next batch); a later ``read_many`` of exactly them uses these fetches.

        Only in a process that reads directly (a loader worker); elsewhere it does nothing. One batch ahead: call
        it after the current ``read_many`` has started (its requests go first through the ``max_inflight`` gate),
        and a new call drops the previous guess.
        """
        if not _direct():
            return
        session = self._session()
        for future in session.ahead[1] if session.ahead is not None else ():
            future.cancel()
        ranged = None if ranges is None else [(int(a), int(b)) for a, b in ranges]
        key = (tuple(relpaths), None if ranged is None else tuple(ranged))
        session.ahead = (key, self._submit_reads(session, relpaths, ranged))

    def _read_all(
        self, relpaths: list[str], ranges: list[tuple[int, int]] | None = None
    ) -> list[tuple[bytes | OSError, int | None]]:
        return list(self._fetch(relpaths, ranges))

    def start_many(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[Future[T]] | None:
        """Start ``fn(store, *args)`` for each ``args`` of ``calls`` now, on the request threads (a read ahead).

        Their futures, in order; ``None`` where this process does not call obstore itself (then nothing starts).
        """
        if not _direct():
            return None
        session = self._session()
        budget = self.settings["retry_timeout"]
        return [session.submit(retried, budget, fn, session.store, *args) for args in calls]

    def run_many(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[T | BaseException]:
        """``fn(store, *args)`` for each ``args`` of ``calls``, up to ``max_inflight`` at once.

        Each one's result or error, in order; made here in a loader worker, else in the helper process; retried as a
        read is.
        """
        if not _direct():
            return helper().call(_call_method, self, "run_many", (fn, list(calls)))
        session = self._session()
        budget = self.settings["retry_timeout"]
        futures = [session.submit(retried, budget, fn, session.store, *args) for args in calls]
        out: list[T | BaseException] = []
        for future in futures:
            try:
                out.append(future.result())
            except Exception as err:  # noqa: BLE001 - handed to the caller, in order
                out.append(err)
        return out

    def stat(self, relpath: str) -> ObjectStat:
        """Size and ETag of one object.

        Raises:
            FileNotFoundError: If it does not exist.
        """
        return self._call("_stat", relpath)

    def _stat(self, relpath: str) -> ObjectStat:
        import obstore

        try:
            meta = retried(self.settings["retry_timeout"], obstore.head, self._session().store, relpath)
        except Exception as err:  # noqa: BLE001 - named as an OSError
            raise as_os_error(err, self.url(relpath), self.credential_source()) from None
        return ObjectStat(int(meta["size"]), str(meta.get("e_tag") or meta["last_modified"]))

    def list_prefixes(self, prefix: str = "") -> list[str]:
        """The "sub-folders" directly under ``prefix`` (common prefixes, without the trailing ``/``), sorted."""
        return self._call("_list_prefixes", prefix)

    def _list_prefixes(self, prefix: str) -> list[str]:
        import obstore

        try:
            store = self._session().store
            result = retried(self.settings["retry_timeout"], obstore.list_with_delimiter, store, prefix or None)
        except Exception as err:  # noqa: BLE001 - named as an OSError
            raise as_os_error(err, self.url(prefix), self.credential_source()) from None
        cut = len(prefix.rstrip("/")) + 1 if prefix else 0
        return sorted(p.rstrip("/")[cut:] for p in result["common_prefixes"])

    def list_many(self, prefixes: Sequence[str]) -> list[list[ObjectStat]]:
        """Every object under each prefix (recursively), the prefixes listed concurrently; keys relative to the root."""
        return self._call("_list_many", list(prefixes))

    def _list_many(self, prefixes: list[str]) -> list[list[ObjectStat]]:
        session = self._session()
        budget = self.settings["retry_timeout"]
        futures = [session.submit(retried, budget, list_prefix, session.store, p) for p in prefixes]
        out = []
        for prefix, future in zip(prefixes, futures):
            try:
                out.append(future.result())
            except Exception as err:  # noqa: BLE001 - named as an OSError
                raise as_os_error(err, self.url(prefix), self.credential_source()) from None
        return out

    def run_direct(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(store, *args)`` in a process where obstore may run (here, or in the helper process).

        Raises:
            OSError: For obstore's errors (naming the root); ``fn``'s other errors as they are.
        """
        if not _direct():
            return helper().call(_call_method, self, "run_direct", (fn, *args))
        try:
            return fn(self._session().store, *args)
        except Exception as err:
            from obstore.exceptions import BaseError

            if isinstance(err, BaseError):  # obstore's own errors become an OSError naming the root
                raise as_os_error(err, self.root, self.credential_source()) from None
            raise

    def fingerprint(self) -> str:
        """A short digest of the root and the settings that select the data (not the credentials)."""
        endpoint = str(self.options.get("endpoint") or self.env.get("AWS_ENDPOINT_URL") or "")
        return hashlib.sha1(f"{self.root}|{endpoint}".encode()).hexdigest()[:16]


def _call_method(storage: ObjectStorage, name: str, args: tuple[Any, ...]) -> Any:
    return getattr(storage, name)(*args)
