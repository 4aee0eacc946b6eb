"""The device half of a recipe in static shapes: its parameters in one host buffer, then a fixed sequence of ops.

Every parameter of a batch is drawn on the host into one buffer; the device then runs ops that read only that buffer
and the batch.

:class:`StaticDeviceHalf` takes a :class:`~lightning_fastdata.augment.pipeline.DeviceAugment` whose transforms it
can do so (``device_transforms``: ``TrivialAugmentWide``/``RandAugment``; ``batch_transforms``: ``RandomErasing``,
torchvision's ``MixUp``, ``CutMix`` and a ``RandomChoice`` of them) and gives its pixels and targets bit for bit
(tested):

- :meth:`~StaticDeviceHalf.plan` (host): the policies' rounds
  (:func:`~lightning_fastdata.augment.graphed.static.round_parameters`), each erasing's boxes, each mixing's ``lam`` and
  box, drawn from the keys and seeds the eager path draws from (MixUp's and CutMix's with torch's generator seeded
  as the eager path seeds it, through their own ``make_params``), packed into one float64 buffer;
- :meth:`~StaticDeviceHalf.run` (device): the buffer's values, the batch, nothing else: no host-to-device copy, no
  read back, no shape that depends on a draw. A mixing is one op for MixUp and CutMix alike (the pairs' blend by
  ``lam``, then the box taken from the partner: an empty box for MixUp, ``lam`` 1 for CutMix).

What a CUDA graph captures once and replays (issue 60); on the CPU the eager path is the faster one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchvision.transforms import v2

import lightning_fastdata.augment.graphed.static as static
import lightning_fastdata.augment.ops as ops
from lightning_fastdata.augment.batched import RandomErasing, _Policy
from lightning_fastdata.augment.keyed import batch_seed
from lightning_fastdata.augment.pipeline import DeviceAugment, mixable_targets

__all__ = ["StaticDeviceHalf", "static_capable"]

_MIXES = (v2.MixUp, v2.CutMix)


def _mixing(t: Any) -> bool:
    if isinstance(t, _MIXES):
        return True
    return isinstance(t, v2.RandomChoice) and all(isinstance(x, _MIXES) for x in t.transforms)


def static_capable(augment: DeviceAugment) -> bool:
    """Whether :class:`StaticDeviceHalf` can do ``augment``'s transforms (the module docstring's list)."""
    policies = all(isinstance(t, _Policy) for t in augment.device_transforms)
    after = all(isinstance(t, RandomErasing) or _mixing(t) for t in augment.batch_transforms)
    return policies and after


def _mix_draw(t: Any, seed: int, n: int, h: int, w: int) -> tuple[float, tuple[int, int, int, int]]:
    """``(lam, box)`` of one mixing, as the eager path draws it (torch's generator seeded with ``seed``).

    The box is ``(x1, y1, x2, y2)``; MixUp's is empty and its ``lam`` its own, CutMix's ``lam`` is its adjusted one.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if isinstance(t, v2.RandomChoice):
            t = t.transforms[int(torch.multinomial(torch.tensor(t.p), 1))]
        params = t.make_params([torch.empty((n, 3, h, w), device="meta")])
    if isinstance(t, v2.MixUp):
        return float(params["lam"]), (0, 0, 0, 0)
    return float(params["lam_adjusted"]), tuple(int(v) for v in params["box"])  # type: ignore[return-value]


class StaticDeviceHalf:
    """A :class:`~lightning_fastdata.augment.pipeline.DeviceAugment` in static shapes (module docstring).

    Args:
        augment: The device half to do; :func:`static_capable` must hold.

    Raises:
        ValueError: If ``augment`` holds a transform this cannot do (named).
    """

    def __init__(self, augment: DeviceAugment) -> None:
        if not static_capable(augment):
            names = [type(t).__name__ for t in [*augment.device_transforms, *augment.batch_transforms]]
            raise ValueError(
                f"The device half {names} has a transform without a static form; static shapes take "
                "TrivialAugmentWide/RandAugment, RandomErasing, MixUp, CutMix and a RandomChoice of them."
            )
        self.augment = augment

    def __bool__(self) -> bool:
        return bool(self.augment)

    def plan(self, keys: torch.Tensor, n: int, h: int, w: int) -> tuple[torch.Tensor, static.Layout]:
        """Every parameter of a batch of ``n`` images ``h x w`` with ``keys`` (host), in one float64 buffer."""
        return static.pack(self.plan_parts(keys, n, h, w))

    def plan_parts(self, keys: torch.Tensor, n: int, h: int, w: int) -> dict[str, torch.Tensor]:
        """:meth:`plan`'s parameters by name (host).

        Per sample (first dimension ``n``), or, named ``*.mix``, the batch's own (a mixing's ``lam`` and box).
        """
        a = self.augment
        parts: dict[str, torch.Tensor] = {}
        for i, policy in enumerate(a.device_transforms):
            for r, (names, magnitude) in enumerate(policy.params(keys, a._seeds[i], h, w)):
                for name, value in static.round_parameters(names, magnitude, h, w).items():
                    parts[f"d{i}.{r}.{name}"] = value
        after = len(a.device_transforms)
        for i, t in enumerate(a.batch_transforms):
            if isinstance(t, RandomErasing):
                parts[f"b{i}.boxes"] = t.boxes(keys, a._seeds[after + i], h, w)
            else:
                lam, box = _mix_draw(t, batch_seed(a.seed, keys, 200 + i), n, h, w)
                blend = lam if box == (0, 0, 0, 0) else 1.0  # MixUp blends the pixels; CutMix only the targets
                parts[f"b{i}.mix"] = torch.tensor([blend, 1.0 - blend, lam, 1.0 - lam, *box], dtype=torch.float64)
        return parts

    def run(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        params: dict[str, torch.Tensor],
        normalize: Callable[[torch.Tensor], torch.Tensor],
        num_classes: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The augmented, normalised ``images`` and the targets, from :meth:`plan`'s values (unpacked)."""
        a = self.augment
        for i, policy in enumerate(a.device_transforms):
            for r in range(policy.num_ops):
                round_params = {k.split(".", 2)[2]: v for k, v in params.items() if k.startswith(f"d{i}.{r}.")}
                images = static.apply_parameters(images, round_params, policy.fill, policy.interpolation)
        images = normalize(images)
        for i, t in enumerate(a.batch_transforms):
            if isinstance(t, RandomErasing):
                images = ops.erase_masked(images, params[f"b{i}.boxes"], t.value, t.inplace)
                continue
            labels = mixable_targets(labels, num_classes, images.dtype)
            images, labels = _mix(images, labels, params[f"b{i}.mix"])
        return images, labels

    def __call__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        keys: torch.Tensor,
        normalize: Callable[[torch.Tensor], torch.Tensor],
        num_classes: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`plan` on the host, one copy of its buffer to the batch's device, :meth:`run` there."""
        n, _, h, w = images.shape
        buffer, layout = self.plan(keys, n, h, w)
        params = static.unpack(ops.to_device(buffer, images.device), layout)
        return self.run(images, labels, params, normalize, num_classes)


def _mix(images: torch.Tensor, labels: torch.Tensor, mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp or CutMix as one op: ``mix`` is ``(blend, 1 - blend, lam, 1 - lam, x1, y1, x2, y2)`` (float64, device).

    torchvision's arithmetic: the pixels ``partner * (1 - blend) + own * blend`` in float32 (MixUp: ``blend`` is its
    ``lam``; CutMix: 1, exactly ``own``), then the box's pixels from the partner (none for MixUp); the targets blend
    the same way with ``lam`` (CutMix's adjusted one).
    """
    blend, rest = mix[0].to(images.dtype), mix[1].to(images.dtype)
    rolled = images.roll(1, 0)
    out = rolled.mul(rest).add_(images.mul(blend))
    h, w = images.shape[-2:]
    x1, y1, x2, y2 = mix[4:8].to(torch.int64).unbind(0)
    rows = torch.arange(h, device=images.device)
    cols = torch.arange(w, device=images.device)
    box = ((rows >= y1) & (rows < y2)).view(h, 1) & ((cols >= x1) & (cols < x2)).view(1, w)
    out = torch.where(box, rolled, out)
    targets = labels.roll(1, 0).mul_(mix[3].to(labels.dtype)).add_(labels.mul(mix[2].to(labels.dtype)))
    return out, targets
