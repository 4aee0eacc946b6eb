"""Measurements that need a fresh process each (memory deltas, nothing cached in memory), run by the scale suite.

``python -m benchmarks.probes PROBE ARGS...`` runs one and prints its result as one JSON line;
:func:`run_probe` starts it and parses that line. Everything is imported before a probe measures, so a
probe's memory delta is the data it built, not the code it loaded. Inside :func:`probe_server` the imports are
paid once: one process imports everything, then forks a child for each probe (the child's state is a fresh
process's after its imports; ~5 s of torch's import saved a probe).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import IO, Any

from benchmarks import REPO

__all__ = ["PROBES", "check", "main", "probe_server", "run_probe", "scan", "serve", "worker_pss"]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024


def _children() -> list[int]:
    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(p))
            except OSError:
                pass
    return sorted(out)


def scan(how: str, root: str, index_dir: str) -> dict[str, Any]:
    """Seconds and MB to list ``root``: ``torchvision`` ImageFolder, ``ours``, or the index (``first``/``reuse``)."""
    import torchvision

    from lightning_fastdata.loading.index.files import scan_image_folder
    from lightning_fastdata.loading.index.store import IndexStore

    before, start = _rss_mb(), time.perf_counter()
    kept: Any
    if how == "torchvision":
        kept = torchvision.datasets.ImageFolder(root)
    elif how == "ours":
        kept = scan_image_folder(root)
    else:
        kept, lookup = IndexStore(index_dir).folder(root)
        if lookup.reused != (how == "reuse"):
            raise RuntimeError(f"index lookup {lookup} for {how!r}")
    return {"s": time.perf_counter() - start, "mb": _rss_mb() - before, "files": len(kept)}


def check(mode: str, root: str, index_dir: str, cache_dir: str) -> dict[str, Any]:
    """Seconds to check a current cache of ``root`` with ``verify_source=mode`` (raises if it is stale)."""
    from lightning_fastdata.cache.build import build_tensor_cache
    from lightning_fastdata.loading.index.store import IndexStore

    index, lookup = IndexStore(index_dir).folder(root)
    start = time.perf_counter()
    build_tensor_cache(cache_dir, index, None, read_only=True, progress=False, verify_source=mode)  # type: ignore[arg-type]
    return {"s": time.perf_counter() - start, "files": len(index), "index_reused": lookup.reused}


def worker_pss(which: str, root: str, epochs: str, batches: str) -> dict[str, Any]:
    """PSS (MB) of each of 2 workers after each epoch of ``batches`` batches, and of the main process."""
    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.measure import baseline_loader

    loader: Any
    if which == "torchvision":
        loader = baseline_loader(root, 64, 64, 2)
    else:
        dm = ImageFolderDataModule(
            root,
            val_fraction=0.0,
            image_size=64,
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            entropy_index=False,  # the plain decode, the same in every run (no index taken up from a cache)
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
    per_epoch = []
    for epoch in range(int(epochs)):
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for _ in itertools.islice(iter(loader), int(batches)):
            pass
        per_epoch.append([_pss_mb(p) for p in _children()])
    return {"pss_mb": per_epoch, "main_pss_mb": _pss_mb(os.getpid())}


PROBES: dict[str, Callable[..., dict[str, Any]]] = {"scan": scan, "check": check, "worker_pss": worker_pss}


_SERVER: list[subprocess.Popen[str]] = []  # the probe_server() in effect, if any


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)  # the lab: a checkout's
    return {**os.environ, "PYTHONPATH": path}


@contextlib.contextmanager
def probe_server() -> Iterator[None]:
    """Within it, :func:`run_probe` forks each probe from one process that imported everything once."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.probes", "--serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    _SERVER.append(proc)
    try:
        yield
    finally:
        _SERVER.remove(proc)
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_line(stream: IO[str], timeout: float, what: str) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise TimeoutError(f"probe {what} gave no result in {timeout:g} s")
    line = stream.readline()
    if not line:
        raise RuntimeError(f"the probe server died during probe {what} (its stderr is above)")
    return line


def run_probe(probe: str, *args: str, timeout: float = 1200) -> dict[str, Any]:
    """Run ``probe`` in a fresh interpreter (forked from the :func:`probe_server` if one is open); its JSON result.

    Raises:
        RuntimeError: With the probe's stderr or traceback, if it failed.
        TimeoutError: Past ``timeout`` seconds in a probe server.
    """
    if _SERVER:
        proc = _SERVER[-1]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps([probe, *args]) + "\n")
        proc.stdin.flush()
        got = json.loads(_read_line(proc.stdout, timeout, f"{probe} {' '.join(args)}"))
        if "error" in got:
            raise RuntimeError(f"probe {probe} {' '.join(args)} failed:\n{got['error']}")
        return got["result"]
    cmd = [sys.executable, "-m", "benchmarks.probes", probe, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _import_everything() -> None:
    import torchvision  # noqa: F401

    import lightning_fastdata.cache.build  # noqa: F401
    import lightning_fastdata.loading.index.store  # noqa: F401
    from lightning_fastdata import ImageFolderDataModule  # noqa: F401
    from lightning_fastdata.measure import baseline_loader  # noqa: F401


def serve() -> None:
    """Import everything once, then for each line on stdin (a JSON list: probe, args) fork a child to run it.

    Each result is one JSON line on stdout, ``{"result": ...}`` or ``{"error": traceback}``; a child's own
    output goes to stderr.
    """
    _import_everything()
    out = sys.stdout
    for line in sys.stdin:
        probe, *args = json.loads(line)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a fresh process after its imports
            os.close(read)
            os.dup2(2, 1)
            try:
                got: dict[str, Any] = {"result": PROBES[probe](*args)}
            except BaseException:
                got = {"error": traceback.format_exc()}
            with os.fdopen(write, "w") as f:
                f.write(json.dumps(got))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            text = json.dumps({"error": f"the probe's process ended with status {status} and no result"})
        out.write(text + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.probes PROBE ARGS...``: print the probe's result as JSON (``--serve``: :func:`serve`)."""
    probe, *args = sys.argv[1:] if argv is None else argv
    if probe == "--serve":
        serve()
        return
    print(json.dumps(PROBES[probe](*args)))


if __name__ == "__main__":
    main()
