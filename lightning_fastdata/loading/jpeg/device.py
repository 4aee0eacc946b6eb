"""JPEG decode on the training device (``decode_on="device"``): the workers plan, nvJPEG decodes, the GPU crops.

Where the loader workers' JPEG decode is what limits training (large photos, few CPUs per GPU), a DataModule with
``decode_on="device"`` moves the decode to the GPU:

- **in the workers** (:func:`plan_crop`): each image's header is read (its size; nothing is decoded), its crop box
  and flip drawn from its key exactly as the workers' own decode draws them, and the encoded bytes packed into one
  buffer (:class:`~lightning_fastdata.loading.batch.EncodedBatch`). What nvJPEG cannot take (PNG and other formats,
  CMYK/YCCK JPEGs, decoded arrays) is decoded and cropped there as before and travels as pixels;
- **on the device** (:func:`decode_encoded`): ``torchvision.io.decode_jpeg(list, device="cuda")`` decodes the batch
  with nvJPEG, each crop is cut from its image, resized (bilinear, antialiased) to ``S x S`` and flipped, and the
  rows rounded to uint8, so the device policies and the normalisation see what the workers' path gives them.

A batch nvJPEG refuses as a whole is decoded image by image; an image it refuses alone is decoded by libjpeg-turbo
on the host and copied over; one neither decodes is corrupt, handled as ``on_corrupt`` says. The pixels differ from
the workers' decode by the two IDCTs and the resize's rounding (a PSNR, not bits: the docs' Benchmarks page).
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

from lightning_fastdata.augment.geometry import Box
from lightning_fastdata.errors import CORRUPT_IMAGE_ADVICE, CorruptImageError, DataError, InvalidValueError
from lightning_fastdata.loading.batch import EncodedBatch
from lightning_fastdata.loading.jpeg.decode import check_box, check_size, image_data_errors, jpeg_header_box

__all__ = ["check_device_decode", "decode_encoded", "plan_crop"]

_JPEG_MAGIC = b"\xff\xd8\xff"
#: libjpeg's colour spaces nvJPEG decodes to RGB: grayscale, RGB, YCbCr (CMYK and YCCK are decoded in the workers).
_DEVICE_COLOR_SPACES = (1, 2, 3)


def plan_crop(data: bytes, box_fn: Callable[[int, int], Box], name: str = "<bytes>") -> Box | None:
    """The crop box of a JPEG the device decodes (its header read, nothing decoded); ``None``: decode it here.

    ``None`` for anything but a JPEG in grayscale, RGB or YCbCr (a PNG, a CMYK JPEG): the worker decodes those itself.

    Raises:
        CorruptImageError: If the JPEG's header is unreadable, or the image is over PIL's pixel limit (naming
            ``name``, the file).
    """
    if not data.startswith(_JPEG_MAGIC):
        return None
    try:
        return _header_box(data, box_fn)
    except OSError as err:
        raise CorruptImageError(
            f"Cannot decode image {name!r}: {str(err).rstrip('.')}." + CORRUPT_IMAGE_ADVICE
        ) from err


def _header_box(data: bytes, box_fn: Callable[[int, int], Box]) -> Box | None:
    try:
        read = jpeg_header_box(data, box_fn)
    except (DataError, InvalidValueError):
        raise  # over the pixel limit (a corrupt image, said so), or a box outside the image (the caller's bug)
    except (OSError, ValueError, RuntimeError) as err:
        raise DataError(f"unreadable JPEG header: {err}") from err
    if read is not None:
        return read[3] if read[2] in _DEVICE_COLOR_SPACES else None
    with image_data_errors():  # no compiled decoder: PIL reads the header alone until the pixels are asked for
        img = Image.open(io.BytesIO(data))
    if img.mode not in ("RGB", "L"):
        return None
    width, height = img.size
    check_size(width, height)
    box = box_fn(width, height)
    check_box(box, width, height)
    return box


def check_device_decode(device: torch.device | str) -> None:
    """Refuse ``decode_on="device"`` on a device nvJPEG cannot decode to (naming the argument and what to do).

    Raises:
        ValueError: If ``device`` is not a CUDA device, or this torch has no CUDA device to use.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise InvalidValueError(
            f"decode_on='device' decodes JPEGs with nvJPEG on a CUDA GPU; this Trainer trains on {device.type!r}. "
            "Use decode_on='workers' (the default: the loader workers decode), or train on a GPU (accelerator='gpu')."
        )
    if not torch.cuda.is_available():
        raise InvalidValueError(
            "decode_on='device' needs a CUDA GPU, and this torch sees none (torch.cuda.is_available() is False); "
            "use decode_on='workers'."
        )


def decode_encoded(
    batch: EncodedBatch, on_corrupt: Callable[[int, int, OSError], None] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode, crop, resize and flip an encoded batch on its device: ``(uint8 images N x 3 x S x S, kept rows)``.

    The device is where :meth:`~lightning_fastdata.loading.batch.EncodedBatch.to` put the batch (its labels and
    pixels): nvJPEG on a CUDA device, libjpeg-turbo (torchvision's CPU decoder) on the CPU.

    Args:
        batch: The batch from the workers, moved to the device.
        on_corrupt: Called with ``(row, sample index, error)`` for an image neither decoder takes; it raises (the
            error, or one past ``max_corrupt_fraction``) or returns, and the row is then left out. ``None``: raise.

    Returns:
        The images (channels-last) and a boolean mask of the batch's rows they are (all ``True`` unless a corrupt
        image was left out).
    """
    device = batch.labels.device
    size = int(batch.rendered.shape[-1])
    n = len(batch.offsets) - 1
    # each crop resized into one float batch (a few kernels an image), then flipped, rounded and made uint8 at once
    resized = torch.zeros((n, 3, size, size), dtype=torch.float32, device=device)
    kept = torch.ones(n, dtype=torch.bool)
    offsets = batch.offsets.tolist()
    rows = [i for i in range(n) if offsets[i + 1] > offsets[i]]
    decoded = _decode_rows([batch.data[offsets[i] : offsets[i + 1]] for i in rows], device)
    boxes = batch.boxes.tolist()
    for row, image in zip(rows, decoded):
        if isinstance(image, OSError):
            index = int(batch.indices[row])
            name = batch.names[row] if batch.names else f"sample {index}"
            err = CorruptImageError(f"Cannot decode image {name!r}: {str(image).rstrip('.')}." + CORRUPT_IMAGE_ADVICE)
            if on_corrupt is None:
                raise err from image
            on_corrupt(row, index, err)
            kept[row] = False
            continue
        top, left, h, w = boxes[row]
        crop = image[:, top : top + h, left : left + w].unsqueeze(0).float()
        if crop.shape[1] == 1:  # grayscale on the CPU decoder's fallback path
            crop = crop.expand(-1, 3, -1, -1)
        resized[row] = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    flipped = batch.flips.to(device, non_blocking=True).view(n, 1, 1, 1)
    resized = torch.where(flipped, resized.flip(-1), resized).round_().clamp_(0, 255)
    out = resized.to(torch.uint8, memory_format=torch.channels_last)
    if len(batch.rendered_rows):
        out[batch.rendered_rows.to(device)] = batch.rendered
    if not bool(kept.all()):
        out = out[kept.to(device)].contiguous(memory_format=torch.channels_last)
    return out, kept


def _decode_rows(spans: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | OSError]:
    """Each span decoded to RGB on ``device``: the batch at once, else one by one, else on the host; or the error."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not spans:
        return []
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders in favour of torchcodec, which has no batched nvJPEG decode yet
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return list(decode_jpeg(spans, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:  # nvJPEG fails a batch as a whole (no partial results): find the image(s) it refused
            pass
        results: list[torch.Tensor | OSError] = []
        for span in spans:
            results.append(_decode_one(span, device, decode_jpeg, ImageReadMode.RGB))
        return results


def _decode_one(span: torch.Tensor, device: torch.device, decode_jpeg: Any, rgb: Any) -> torch.Tensor | OSError:
    try:
        return decode_jpeg(span, mode=rgb, device=device)
    except RuntimeError as err:
        if device.type == "cpu":
            return _data_error(err)
    try:  # what nvJPEG lacks (arithmetic coding, some samplings), libjpeg-turbo on the host may decode
        return decode_jpeg(span, mode=rgb).to(device, non_blocking=True)
    except RuntimeError as err:
        return _data_error(err)


def _data_error(err: RuntimeError) -> DataError:
    """The error torchvision raised, without its source location (``decode_jpeg, .../decode_jpeg.cpp:171, ...``)."""
    text = _SOURCE_LOCATION.sub("", str(err)).strip()
    return DataError("; ".join(line.strip() for line in text.splitlines() if line.strip()) or type(err).__name__)


_SOURCE_LOCATION = re.compile(r"\w+, \S+\.(?:cpp|cu|h):\d+, ?")
