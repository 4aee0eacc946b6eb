"""Every torch op a piece of code runs, where it ran and on how much: the GPU check's op recorder.

:class:`OpRecorder` is a ``TorchDispatchMode``: inside ``with OpRecorder() as rec:`` each aten op that reaches the
dispatcher is counted by (op, device, calling frame), with its calls and its largest tensor (elements). The
calling frame is the first frame outside torch, torchvision and this module: the line of our code (or the user's)
that asked for the op. :meth:`OpRecorder.host_work` lists the ops on the CPU that handle at least ``elements``
(one image's worth, say): batch-sized work the training process does on the host, which competes with the loader
workers for the CPUs (torch runs such ops on its intra-op threads).

A stand-in for the GPU on a machine without one: put the batch on the ``meta`` device. Every op on ``meta`` is one
that would run on the GPU; every op on ``cpu`` would run on the host. Meta ops run Python meta kernels, so the
recorder tells which ops run where and on how much, not what they cost on CUDA.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["GRAIN", "WAIT_OPS", "OpRecorder", "OpRow", "format_rows", "waits_for_device"]

#: torch's ``at::internal::GRAIN_SIZE``: a CPU op on at least this many elements may be split over the intra-op threads.
GRAIN = 32768

#: Frames from these folders are skipped when the calling frame is looked for.
_SKIP = tuple(
    os.path.dirname(path) + os.sep
    for path in (getattr(torch, "__file__", None), getattr(__import__("torchvision"), "__file__", None))
    if path
) + (os.path.abspath(__file__),)


@dataclass
class OpRow:
    """One (op, device, frame): how often it ran and the most elements of a tensor it read or wrote."""

    op: str
    device: str
    frame: str
    calls: int = 0
    max_elements: int = 0
    total_elements: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values."""
        return {
            "op": self.op,
            "device": self.device,
            "frame": self.frame,
            "calls": self.calls,
            "max_elements": self.max_elements,
            "total_elements": self.total_elements,
        }


class OpRecorder(TorchDispatchMode):
    """Record every aten op run in this thread inside ``with``: op, device, elements, calling frame.

    Ops run by other threads (the pin-memory thread, autograd's backward threads) are not seen: a dispatch mode is
    per thread. Recording costs a stack walk per op (tens of microseconds): record a few steps, not a run.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str, str], OpRow] = {}
        self.waits: dict[str, int] = {}  # "op at frame" -> calls that made the host wait for the device
        self._thread = threading.get_ident()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if threading.get_ident() == self._thread:
            tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
            if tensors:
                device = str(tensors[0].device.type)
                if any(t.device.type != "cpu" for t in tensors):  # an op with a device tensor runs on the device
                    device = next(t.device.type for t in tensors if t.device.type != "cpu")
                elements = max(t.numel() for t in tensors)
            else:
                device, elements = "cpu", 0
            key = (str(func.overloadpacket.__name__), device, _caller())
            if tensors and waits_for_device(key[0], args, kwargs or {}, out):
                self.waits[f"{key[0]} at {key[2]}"] = self.waits.get(f"{key[0]} at {key[2]}", 0) + 1
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = OpRow(*key)
            row.calls += 1
            row.total_elements += elements
            row.max_elements = max(row.max_elements, elements)
        return out

    def host_work(self, elements: int) -> list[OpRow]:
        """The ops on the CPU that handled ``elements`` or more elements at least once, largest first."""
        rows = [r for r in self.rows.values() if r.device == "cpu" and r.max_elements >= elements]
        return sorted(rows, key=lambda r: (-r.max_elements, -r.calls))

    def table(self, elements: int, top: int = 40) -> list[dict[str, Any]]:
        """:meth:`host_work` first, then the other rows by calls: at most ``top`` rows, as dicts."""
        first = self.host_work(elements)
        seen = {id(r) for r in first}
        rest = sorted((r for r in self.rows.values() if id(r) not in seen), key=lambda r: -r.calls)
        return [{**r.as_dict(), "batch_sized_on_host": id(r) in seen} for r in [*first, *rest][:top]]

    def calls_by_device(self) -> dict[str, int]:
        """How many op calls ran on each device."""
        out: dict[str, int] = {}
        for r in self.rows.values():
            out[r.device] = out.get(r.device, 0) + r.calls
        return out


#: Ops whose result the host needs at once: on a device tensor, each waits for everything queued before it.
WAIT_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2", "equal"})


def waits_for_device(op: str, args: Any, kwargs: dict[str, Any], out: Any) -> bool:
    """Whether this op makes the host wait for the device: a number read from a device tensor (``.item()``,
    ``.tolist()``, ``nonzero``...), or a copy to the host that is not ``non_blocking``."""
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    on_device = any(t.device.type != "cpu" for t in inputs)  # (on ``meta`` these ops raise before they get here)
    if op in WAIT_OPS:
        return on_device
    if op in ("_to_copy", "copy_") and on_device and not kwargs.get("non_blocking", False):
        target = args[0] if op == "copy_" else out  # copy_(dest, src); _to_copy returns the copy
        blocking = op == "_to_copy" or not (len(args) > 2 and args[2])  # copy_(dest, src, non_blocking)
        return isinstance(target, torch.Tensor) and target.device.type == "cpu" and blocking
    return False


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP) and "<frozen" not in path:
            return f"{_short(path)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _short(path: str) -> str:
    for marker in ("lightning_fastdata" + os.sep, "site-packages" + os.sep):
        if marker in path:
            return path[path.index(marker) :]
    return path


def format_rows(rows: Iterable[dict[str, Any]]) -> str:
    """A plain-text table of :meth:`OpRecorder.table`'s rows."""
    lines = [f"{'op':<28} {'device':<6} {'calls':>6} {'max elems':>11}  frame"]
    for r in rows:
        flag = "*" if r.get("batch_sized_on_host") else " "
        lines.append(f"{flag}{r['op']:<27} {r['device']:<6} {r['calls']:>6} {r['max_elements']:>11}  {r['frame']}")
    return "\n".join(lines)
