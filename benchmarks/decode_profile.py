"""Where one RandomResizedCrop sample's CPU goes, on one core: the profile issue 26 asks for before building.

Each stage timed alone, over the same photo-like JPEGs and the same crop boxes (torchvision's RandomResizedCrop
parameters, 224 px output), one thread:

- ``full decode``: ``torchvision.io.decode_jpeg`` of the whole image (the ceiling's unit of work);
- ``full decode (PIL)``: the reference for the next rows (PIL's own overhead included);
- ``DCT 1/2, 1/4, 1/8``: PIL's ``draft`` decode of the whole image at that scale. At 1/8 only each block's DC
  coefficient is inverse-transformed and the colour conversion handles 1/64 of the pixels, so what is left is
  mostly the entropy (Huffman) decoding of every coefficient: the floor that no scaled decode goes below;
- ``ROI decode``: our ``_jpegroi`` decode of the crop's rows and iMCU columns at full resolution (what the folder
  module does for crops under twice the output);
- ``resize``: the decoded crop to 224 x 224 (torch's antialiased bilinear kernel, channels-last), and ``copy``
  of the result into a batch slot;
- ``whole path``: ``decode_resized_crop`` as the loader calls it (the draft path for crops at least twice the
  output).

    python -m benchmarks.decode_profile --images 256

Prints a table of milliseconds per image and each stage's share of a full decode; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading import decode


def _per_image_ms(fn: Callable[[int], Any], n: int, repeats: int = 3) -> float:
    """Best of ``repeats`` passes of ``fn(i)`` for ``i < n``, in milliseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter() - start) / n)
    return 1000 * best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg

    with tempfile.TemporaryDirectory(prefix="fastdata-decode-profile-") as tmp:
        root = make_image_folder(Path(tmp) / "p", num_classes=1, per_class=args.images, size=(500, 375), processes=2)
        blobs = [f.read_bytes() for f in sorted(root.rglob("*.jpg"))]
    n = len(blobs)
    rng = np.random.default_rng(0)
    sizes = [Image.open(io.BytesIO(b)).size for b in blobs]
    boxes = [decode.random_resized_crop_box(rng, w, h) for w, h in sizes]
    out = torch.empty(3, args.size, args.size, dtype=torch.uint8)
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]

    def draft(scale: int) -> Callable[[int], Any]:
        def run(i: int) -> Any:
            img = Image.open(io.BytesIO(blobs[i]))
            if scale > 1:
                img.draft("RGB", (sizes[i][0] // scale, sizes[i][1] // scale))
            return img.convert("RGB")

        return run

    crops = [decode._decode_roi(blobs[i], boxes[i]).clone() for i in range(n)] if decode.roi_decode_available() else []

    def resize_only(i: int) -> None:
        chw = crops[i]
        x = chw.unsqueeze(0).contiguous(memory_format=torch.channels_last)
        torch.nn.functional.interpolate(x, size=(args.size, args.size), mode="bilinear", antialias=True)

    resized = torch.empty(3, args.size, args.size, dtype=torch.uint8)
    stages: dict[str, float] = {
        "full decode (decode_jpeg)": _per_image_ms(lambda i: decode_jpeg(tensors[i], mode=ImageReadMode.RGB), n),
        "full decode (PIL, the draft rows' reference)": _per_image_ms(draft(1), n),
        "DCT 1/2 whole image (PIL draft)": _per_image_ms(draft(2), n),
        "DCT 1/4 whole image (PIL draft)": _per_image_ms(draft(4), n),
        "DCT 1/8 whole image (PIL draft): ~entropy decoding floor": _per_image_ms(draft(8), n),
    }
    if crops:
        stages["ROI decode of the crop (_jpegroi, full resolution)"] = _per_image_ms(
            lambda i: decode._decode_roi(blobs[i], boxes[i]), n
        )
        stages["resize crop -> 224 (antialiased bilinear)"] = _per_image_ms(resize_only, n)
    stages["copy 224 x 224 x 3 into a batch slot"] = _per_image_ms(lambda i: out.copy_(resized), n)
    stages["whole path (decode_resized_crop)"] = _per_image_ms(
        lambda i: decode.decode_resized_crop(blobs[i], out, lambda w, h, b=boxes[i]: b), n
    )
    full = stages["full decode (decode_jpeg)"]
    crop_sides = np.array([min(b[2], b[3]) for b in boxes])
    print(f"decode profile: {n} photo-like 500x375 JPEGs, one core, {args.size} px RandomResizedCrop boxes")
    print("| stage | ms per image | vs full decode |")
    print("|---|---:|---:|")
    for name, ms in stages.items():
        print(f"| {name} | {ms:.3f} | {ms / full:.2f} |")
    shares = {
        f"crops with shorter side >= {s}": float((crop_sides >= s).mean()) for s in (args.size, 256, 299, 2 * args.size)
    }
    for name, share in shares.items():
        print(f"{name}: {share:.0%}")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "images": n,
        "ms_per_image": stages,
        "crop_shares": shares,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
