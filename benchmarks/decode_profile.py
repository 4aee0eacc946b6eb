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
- ``lossless crop``: the same crop decoded from ``jpegtran -crop``'s lossless crop of the file (only where
  ``jpegtran`` is installed; Debian: ``libjpeg-turbo-progs``): the entropy decoding limited to the crop's iMCUs,
  what a per-image entropy index would leave;
- ``whole path``: ``decode_resized_crop`` as the loader calls it (the draft path for crops at least twice the
  output).

    python -m benchmarks.decode_profile --images 256

Prints a table of milliseconds per image and each stage's share of a full decode; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import record
from lightning_fastdata.augment import geometry
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.jpeg import decode


def _per_image_ms(fn: Callable[[int], Any], n: int, repeats: int = 3) -> float:
    """Best of ``repeats`` passes of ``fn(i)`` for ``i < n``, in milliseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter() - start) / n)
    return 1000 * best


def _quality(
    blobs: list[bytes], tensors: list[torch.Tensor], boxes: list[geometry.Box], sizes: tuple[int, ...]
) -> dict[str, dict[str, float]]:
    """PSNR of the default decode path against the reference: a full exact decode, the same box, antialiased resize.

    Per output size: the mean over images and the worst image (the reference is what ``exact=True`` computes, up
    to the decoder: torchvision's ``decode_jpeg`` of the whole image, cropped, torch's antialiased bilinear).
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    result = {}
    for size in sizes:
        got = torch.empty(3, size, size, dtype=torch.uint8)
        want = torch.empty(3, size, size, dtype=torch.uint8)
        psnr = []
        psnr, psnr_decode = [], []
        for i, blob in enumerate(blobs):
            full = decode_jpeg(tensors[i], mode=ImageReadMode.RGB)
            decode.decode_resized_crop(blob, got, lambda wd, ht, b=boxes[i]: b)
            # the sampled box, and the box the DCT-scaled path decodes (its edges on the 1/r grid)
            r = decode._draft_scale(boxes[i], (size, size))
            snapped = decode._scaled_box(boxes[i], (int(full.shape[2]), int(full.shape[1])), r)
            for box, into in ((boxes[i], psnr), (tuple(v * r for v in snapped), psnr_decode)):
                top, left, h, w = box
                geometry.resize_crop_into(want, full[:, top : top + h, left : left + w])
                mse = float(((got.float() - want.float()) ** 2).mean())
                into.append(99.0 if mse == 0 else 10 * float(np.log10(255**2 / mse)))
        shares = np.array([min(b[2], b[3]) >= 2 * size for b in boxes])
        result[f"{size} px"] = {
            "mean_db": float(np.mean(psnr)),
            "worst_db": float(np.min(psnr)),
            "decode_only_mean_db": float(np.mean(psnr_decode)),
            "decode_only_worst_db": float(np.min(psnr_decode)),
            "share_dct_scaled": float(shares.mean()),
        }
    return result


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
    boxes = [geometry.random_resized_crop_box(rng.random(geometry.CROP_DRAWS), w, h) for w, h in sizes]
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
    if crops:
        roi = decode._jpegroi
        buf = bytearray(4 * 1024 * 1024)

        def roi_at(i: int, scale_num: int, fast: bool) -> Any:
            """The crop's rows and columns decoded at scale_num/8 (box rounded outwards in the scaled image)."""
            top, left, h, w = boxes[i]
            t, lft = top * scale_num // 8, left * scale_num // 8
            hh = max(1, min(-(-sizes[i][1] * scale_num // 8), -(-(top + h) * scale_num // 8)) - t)
            ww = max(1, min(-(-sizes[i][0] * scale_num // 8), -(-(left + w) * scale_num // 8)) - lft)
            return roi.decode_crop(blobs[i], t, lft, hh, ww, buf, False, scale_num, fast)

        def smallest_m(i: int) -> int:
            return max(1, min(8, -(-8 * args.size // min(boxes[i][2], boxes[i][3]))))

        stages["ROI decode of the crop, fast IDCT (JDCT_IFAST)"] = _per_image_ms(lambda i: roi_at(i, 8, True), n)
        stages["ROI decode at the smallest M/8 >= output (5/8..7/8 here)"] = _per_image_ms(
            lambda i: roi_at(i, smallest_m(i), False), n
        )
        stages["ROI decode at 1/8 of the crop's rows: its entropy-decoding floor"] = _per_image_ms(
            lambda i: roi_at(i, 1, True), n
        )
    jpegtran = shutil.which("jpegtran")  # Debian: libjpeg-turbo-progs
    if crops and jpegtran:
        # The same crops, decoded from a lossless crop of the file (jpegtran moves the corner to the iMCU grid):
        # the Huffman decoding then covers only the crop's iMCUs, not every row down to its bottom edge. This is
        # what a per-image entropy index (bit offset and DC predictors at iMCU positions) would leave to decode.
        cut = []
        for (top, left, h, w), blob in zip(boxes, blobs, strict=True):
            spec = f"{w}x{h}+{left}+{top}"
            small = subprocess.run([jpegtran, "-crop", spec, "-copy", "none"], input=blob, capture_output=True)
            assert small.returncode == 0, small.stderr
            sw, sh, _ = roi.header(small.stdout)
            cut.append((small.stdout, sh - h, sw - w))
        stages["ROI decode of the crop from a lossless crop of the file (jpegtran): Huffman of the crop only"] = (
            _per_image_ms(lambda i: roi.decode_crop(cut[i][0], cut[i][1], cut[i][2], *boxes[i][2:], buf), n)
        )
        kept = np.mean([len(c[0]) for c in cut]) / np.mean([len(b) for b in blobs])
        print(f"lossless crops: {kept:.0%} of the bytes")
    stages["copy 224 x 224 x 3 into a batch slot"] = _per_image_ms(lambda i: out.copy_(resized), n)
    for size in (args.size, args.size // 2):
        slot = torch.empty(3, size, size, dtype=torch.uint8)
        for exact in (True, False):
            name = f"whole path at {size} px ({'exact=True' if exact else 'default'})"
            stages[name] = _per_image_ms(
                lambda i, s=slot, e=exact: decode.decode_resized_crop(blobs[i], s, lambda w, h, b=boxes[i]: b, exact=e),
                n,
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
    quality = _quality(blobs, tensors, boxes, (args.size, args.size // 2))
    for name, q in quality.items():
        print(
            f"PSNR of the default path vs exact decode + antialiased resize, {name} ({q['share_dct_scaled']:.0%} of "
            f"crops DCT-scaled): same box mean {q['mean_db']:.1f} dB, worst {q['worst_db']:.1f} dB; the box decoded "
            f"(edges on the scaled grid) mean {q['decode_only_mean_db']:.1f} dB, "
            f"worst {q['decode_only_worst_db']:.1f} dB"
        )
    return record(args.json, images=n, ms_per_image=stages, crop_shares=shares, psnr_vs_exact=quality)


if __name__ == "__main__":
    main()
