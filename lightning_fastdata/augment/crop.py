"""Random resized crop + flip of a whole uint8 batch on the device, after transfer (tensor cache option)."""

from __future__ import annotations

import torch

__all__ = ["crop_resize_flip"]


def crop_resize_flip(images: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, size: int) -> torch.Tensor:
    """Crop ``boxes`` out of ``images``, resize each to ``size x size`` and mirror where ``flips``; one batched op.

    Uses ``torchvision.ops.roi_align`` (bilinear, 2 x 2 samples averaged per output pixel, which low-passes
    like an antialiased resize for downscales up to 2x), so the whole batch is one kernel on the GPU.

    Args:
        images: uint8 or float ``N x 3 x S x S``.
        boxes: ``N x 4`` crops as ``(top, left, height, width)`` in pixels.
        flips: ``N`` booleans.
        size: Output side.

    Returns:
        float32 ``N x 3 x size x size`` on the 0-255 scale.
    """
    from torchvision.ops import roi_align

    n = images.shape[0]
    b = boxes.to(device=images.device, dtype=torch.float32)
    rois = torch.stack(
        [
            torch.arange(n, device=images.device, dtype=torch.float32),
            b[:, 1],
            b[:, 0],
            b[:, 1] + b[:, 3],
            b[:, 0] + b[:, 2],
        ],
        dim=1,
    )
    out = roi_align(images.float(), rois, output_size=(size, size), spatial_scale=1.0, sampling_ratio=2, aligned=True)
    flips = flips.to(images.device).view(n, 1, 1, 1)
    return torch.where(flips, out.flip(-1), out).contiguous(memory_format=torch.channels_last)
