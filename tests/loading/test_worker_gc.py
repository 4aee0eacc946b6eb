"""A loader worker never finalises objects it inherited from the training process, and cleans up after itself.

On a GPU, a CUDA object left in a reference cycle in the training process, collected in a forked worker, runs
its finalizer there and aborts the worker ("CUDA error: initialization error"; seen on an H100). The same
mechanism, without CUDA: a cycle whose finalizer records the pid of the process that ran it.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from lightning_fastdata import ImageFolderDataModule


class Finalised:
    """Part of a reference cycle; its finalizer appends the running process's pid to ``log``."""

    def __init__(self, log: Path) -> None:
        self.log, self.me = log, self

    def __del__(self) -> None:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


def _child(init: Callable[[int], None] | None, log: str) -> None:
    if init is not None:
        init(0)
    gc.collect()
    with open(log + ".done", "w") as f:
        f.write(str(os.getpid()))


def _pids_finalising(tmp_path: Path, init: Callable[[int], None] | None) -> tuple[set[str], str]:
    log = tmp_path / f"finalised-{'init' if init else 'plain'}"
    gc.collect()
    gc.disable()  # the cycle must still be garbage, not yet collected, when the worker is forked
    try:
        Finalised(log)  # unreachable at once: only the cycle keeps it
        child = multiprocessing.get_context("fork").Process(target=_child, args=(init, str(log)))
        child.start()
        child.join(30)
        assert child.exitcode == 0
    finally:
        gc.enable()
    gc.collect()  # the training process frees its own garbage
    pids = set(log.read_text().split()) if log.exists() else set()
    return pids, Path(str(log) + ".done").read_text()


def test_inherited_garbage_is_finalised_in_the_training_process_only(image_folder: Path, tmp_path: Path) -> None:
    dm = ImageFolderDataModule(str(image_folder), batch_size=4, num_workers=2, val_fraction=0.0)
    dm.setup("fit")
    init = dm.train_dataloader().worker_init_fn
    assert init is not None
    pids, child = _pids_finalising(tmp_path, init)
    assert pids == {str(os.getpid())}, f"finalised in {pids}; worker {child}"


def test_without_the_worker_init_the_worker_finalises_it(tmp_path: Path) -> None:
    # the control: the hazard is real (a forked child collects the cycle it inherited) unless the init freezes it
    pids, child = _pids_finalising(tmp_path, None)
    assert child in pids


_HOLD_A_LOADER = """
import sys
from lightning_fastdata import ImageFolderDataModule
dm = ImageFolderDataModule(sys.argv[1], batch_size=4, num_workers=2, val_fraction=0.0)
dm.setup("fit")
images, labels = next(iter(dm.train_dataloader()))  # the DataModule keeps the loader, its workers persist
assert images.shape[0] == 4
"""


def test_workers_still_alive_at_exit_clean_up_their_temporary_files(image_folder: Path, tmp_path: Path) -> None:
    """A script (or a notebook) that ends with a DataModule's persistent workers alive leaves no ``pymp-*`` folder.

    Left to multiprocessing, those workers are killed at exit and never remove the folder each made for sending
    batches; a notebook run in a loop filled /tmp with them.
    """
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _HOLD_A_LOADER, str(image_folder)],
        env={**os.environ, "TMPDIR": str(temp)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    left = [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")]
    assert not left, f"left in the temporary folder at exit: {left}"
