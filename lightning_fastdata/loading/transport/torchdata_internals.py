"""Every private torchdata name the package reads, checked once at import.

A ``StatefulDataLoader``'s state is torchdata's own nested dict; the package loads it back through torchdata's
public ``load_state_dict``, and reads one thing inside it: where the batch sampler's iterator keeps the
sampler's state (:class:`~lightning_fastdata.loading.sampler.EpochSampler`'s epoch and position), which an
elastic resume (another world size, batch size or worker count) needs from every old rank. The keys, as torchdata
names them:

- ``stateful_dataloader._SAMPLER_ITER_STATE`` (``"_sampler_iter_state"``): the batch sampler iterator's state, at
  the top of a loader state without workers;
- ``_StatefulMultiProcessingDataLoaderIter._SNAPSHOT`` / ``._MAIN_SNAPSHOT`` (``"_snapshot"`` /
  ``"_main_snapshot"``): with workers, the main process's part of the last snapshot, which holds it instead;
- ``._STEPS_SINCE_SNAPSHOT`` (``"_steps_since_snapshot"``): batches returned after that snapshot (sparse snapshots,
  ``snapshot_every_n_steps``), which a load replays;
- ``sampler._BatchSamplerIterator._SAMPLER_STATE`` (``"sampler_state"``): the sampler's own ``state_dict`` inside.

And one attribute of a loader's iterator: ``_StatefulSingleProcessDataLoaderIter._NUM_YIELDED`` (``"_num_yielded"``,
torch's own iterator attribute): the batches of the epoch already handed out, which an iterator made from a restored
state starts from (:func:`batches_yielded`: what the prefetching iterator counts its epoch's batches from).

The names are read from torchdata's classes, not spelled here, so a torchdata that renames one is caught at
import: :data:`MISSING` lists what this torchdata lacks, and :func:`sampler_state` then returns ``None`` (an
elastic resume restarts its epoch, warned by the caller; a resume on the same world loads torchdata's state whole
and is unaffected). ``tests/loading/test_torchdata_internals.py`` pins the layout on real loaders, with and
without workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchdata.stateful_dataloader import sampler as _sampler
from torchdata.stateful_dataloader import stateful_dataloader as _loader

__all__ = ["MISSING", "batches_yielded", "sampler_state"]


def _name(owner: Any, attribute: str) -> str | None:
    value = getattr(owner, attribute, None)
    return value if isinstance(value, str) else None


_MULTI = getattr(_loader, "_StatefulMultiProcessingDataLoaderIter", None)
_BATCH_ITER = getattr(_sampler, "_BatchSamplerIterator", None)
_KEYS = {
    "stateful_dataloader._SAMPLER_ITER_STATE": _name(_loader, "_SAMPLER_ITER_STATE"),
    "_StatefulMultiProcessingDataLoaderIter._SNAPSHOT": _name(_MULTI, "_SNAPSHOT"),
    "_StatefulMultiProcessingDataLoaderIter._MAIN_SNAPSHOT": _name(_MULTI, "_MAIN_SNAPSHOT"),
    "_StatefulMultiProcessingDataLoaderIter._STEPS_SINCE_SNAPSHOT": _name(_MULTI, "_STEPS_SINCE_SNAPSHOT"),
    "_BatchSamplerIterator._SAMPLER_STATE": _name(_BATCH_ITER, "_SAMPLER_STATE"),
    "_StatefulSingleProcessDataLoaderIter._NUM_YIELDED": _name(
        getattr(_loader, "_StatefulSingleProcessDataLoaderIter", None), "_NUM_YIELDED"
    ),
}

#: The torchdata names above that this torchdata lacks (empty where all are there).
MISSING: tuple[str, ...] = tuple(name for name, key in _KEYS.items() if key is None)


def sampler_state(loader_state: Mapping[str, Any] | None) -> tuple[dict[str, Any], int] | None:
    """The sampler's ``state_dict`` inside a ``StatefulDataLoader`` state, and the batches returned since it.

    Returns ``None`` if the state holds no sampler state where torchdata keeps it (a sampler without one, a
    loader state of another kind, or a torchdata without the names above).
    """
    if MISSING or not isinstance(loader_state, Mapping):
        return None
    iter_key, snapshot_key, main_key, since_key, sampler_key, _ = (str(key) for key in _KEYS.values())
    steps_since = 0
    if snapshot_key in loader_state:  # workers: the main process's part of the last snapshot
        snapshot = loader_state[snapshot_key]
        main = snapshot.get(main_key) if isinstance(snapshot, Mapping) else None
        iter_state = main.get(iter_key) if isinstance(main, Mapping) else None
        steps_since = int(loader_state.get(since_key) or 0)
    else:
        iter_state = loader_state.get(iter_key)
    found = iter_state.get(sampler_key) if isinstance(iter_state, Mapping) else None
    if not isinstance(found, Mapping) or not {"epoch", "seed", "yielded"} <= found.keys():
        return None
    return dict(found), steps_since


def batches_yielded(iterator: Any) -> int:
    """Batches of the epoch a ``StatefulDataLoader`` iterator has handed out, those of a restored state included.

    0 where this torchdata lacks the name (a resumed epoch's count then starts at 0: Lightning's own counter, which
    ends the epoch, is unaffected).
    """
    if MISSING:
        return 0
    return int(getattr(iterator, str(_KEYS["_StatefulSingleProcessDataLoaderIter._NUM_YIELDED"]), 0) or 0)
