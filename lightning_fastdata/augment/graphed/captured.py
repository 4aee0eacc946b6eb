"""The static device half captured once as a CUDA graph and replayed for every batch.

:class:`CapturedDeviceHalf` stands where a :class:`~lightning_fastdata.augment.pipeline.DeviceAugment` stands (the
same call) and runs a :class:`~lightning_fastdata.augment.graphed.half.StaticDeviceHalf` through a graph:

- **static buffers**: the captured images, labels and parameter buffer keep their storage; each batch is copied
  into them (the parameters from pinned host memory, asynchronously, outside the graph), then the graph replays;
- **one shape**: the graph is captured for the first batch's size; a shorter batch (an epoch's last) is padded to
  it, its rows placed last, the row before them a copy of its last sample, so that the pairs MixUp and CutMix make
  (each sample with the one before it, the first with the last) are the batch's own; the batch-level draws are made
  on the real batch's keys; a batch of another size or image size, or of other label dtypes, is not replayed: it
  runs eagerly (the static half, the same pixels);
- **outputs**: the graph writes into the same output tensors every replay, so what the caller gets is a copy of the
  real rows.

``graph`` is what captures and replays: :class:`CudaGraph` on a GPU, :class:`EagerGraph` (which calls the function
again on the static buffers, writing into fixed outputs as a graph does) where there is none and in the CPU tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import lightning_fastdata.augment.graphed.static as static
import lightning_fastdata.augment.ops as ops
from lightning_fastdata.augment.graphed.half import StaticDeviceHalf

__all__ = ["CapturedDeviceHalf", "CudaGraph", "EagerGraph", "pad_index"]

Outputs = tuple[torch.Tensor, torch.Tensor]


class EagerGraph:
    """Stands in for a CUDA graph: :meth:`replay` calls the captured function again and writes into fixed outputs."""

    def __init__(self) -> None:
        self.fn: Callable[[], Outputs] | None = None
        self.outputs: Outputs | None = None

    def capture(self, fn: Callable[[], Outputs]) -> Outputs:
        """Keep ``fn``; its first outputs become the fixed ones."""
        self.fn = fn
        self.outputs = tuple(t.clone() for t in fn())  # type: ignore[assignment]
        return self.outputs  # type: ignore[return-value]

    def replay(self) -> Outputs:
        """Run ``fn`` again on the static buffers, into the fixed outputs."""
        assert self.fn is not None and self.outputs is not None
        for out, new in zip(self.outputs, self.fn()):
            out.copy_(new)
        return self.outputs


class CudaGraph:
    """``torch.cuda.CUDAGraph``: warm-up on a side stream, capture, replay (``torch.cuda.graphs``' recipe)."""

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.graph: Any = None
        self.outputs: Outputs | None = None

    def capture(self, fn: Callable[[], Outputs]) -> Outputs:
        """Warm ``fn`` up on a side stream (lazy initialisations, cached constants), then capture it."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn()
        return self.replay()

    def replay(self) -> Outputs:
        """Launch the captured work once."""
        self.graph.replay()
        assert self.outputs is not None
        return self.outputs


def pad_index(n: int, size: int) -> torch.Tensor:
    """Rows of a batch of ``n`` padded to ``size``: its rows last, each row before them the one ``n`` rows later.

    So ``roll(1)`` pairs every real row with the real row it pairs with in the batch alone (the first with the last).
    """
    return (torch.arange(size) - (size - n)) % n


class CapturedDeviceHalf:
    """A :class:`~lightning_fastdata.augment.graphed.half.StaticDeviceHalf` run through a graph (module docstring).

    Args:
        half: The static device half.
        graph: Captures and replays: ``None`` picks :class:`CudaGraph` for CUDA batches, :class:`EagerGraph` otherwise.
    """

    def __init__(self, half: StaticDeviceHalf, graph: CudaGraph | EagerGraph | None = None) -> None:
        self.half = half
        self.graph = graph
        self._static: dict[str, Any] | None = None
        self.replays = 0
        self.eager_calls = 0

    def __bool__(self) -> bool:
        return bool(self.half.augment)

    def __call__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        keys: torch.Tensor,
        normalize: Callable[[torch.Tensor], torch.Tensor],
        num_classes: int | None = None,
    ) -> Outputs:
        """The augmented, normalised ``images`` and targets: the static half's, by a replay where the batch fits."""
        n, _, h, w = images.shape
        parts = self.half.plan_parts(keys, n, h, w)
        if self._static is None:
            self._capture(images, labels, parts, normalize, num_classes)
        s = self._static
        assert s is not None
        size = s["images"].shape[0]
        fits = n <= size and s["images"].shape[1:] == images.shape[1:] and s["labels"].dtype == labels.dtype
        fits = fits and s["labels"].shape[1:] == labels.shape[1:] and s["num_classes"] == num_classes
        if not fits:
            self.eager_calls += 1
            return self.half(images, labels, keys, normalize, num_classes)
        index = pad_index(n, size)
        buffer, layout = static.pack(_padded(parts, n, index))
        if layout != s["layout"]:
            raise RuntimeError("The device half's parameters changed layout after capture.")
        s["params"].copy_(ops.to_device(buffer, images.device))
        on_device = ops.to_device(index, images.device)
        s["images"].copy_(images.index_select(0, on_device) if n < size else images)
        s["labels"].copy_(labels.index_select(0, on_device) if n < size else labels)
        out_images, out_targets = self.graph.replay()  # type: ignore[union-attr]
        self.replays += 1
        return out_images[size - n :].clone(), out_targets[size - n :].clone()

    def _capture(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        parts: dict[str, torch.Tensor],
        normalize: Callable[[torch.Tensor], torch.Tensor],
        num_classes: int | None,
    ) -> None:
        buffer, layout = static.pack(parts)
        s: dict[str, Any] = {
            "images": images.clone(),
            "labels": labels.clone(),
            "params": ops.to_device(buffer, images.device).clone(),
            "layout": layout,
            "num_classes": num_classes,
        }
        self._static = s
        if self.graph is None:
            self.graph = CudaGraph() if images.device.type == "cuda" else EagerGraph()

        def run() -> Outputs:
            params = static.unpack(s["params"], layout)
            return self.half.run(s["images"], s["labels"], params, normalize, num_classes)

        self.graph.capture(run)


def _padded(parts: dict[str, torch.Tensor], n: int, index: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-sample parameters in the padded batch's rows; the batch's own (``*.mix``) as they are."""
    return {k: v if k.endswith(".mix") else v.index_select(0, index) for k, v in parts.items()}
