"""Run by ``scripts/release.sh`` inside a fresh venv: the installed package's decoder works, on the expected library.

    python release_check.py --expect-library lightning_fastdata.libs

Checks that ``lightning_fastdata`` is imported from the venv (not a checkout), that the compiled decoder loaded
and calls a libjpeg-turbo whose file path contains ``--expect-library`` (the wheel's own copy, or Pillow's), and
that it decodes: crops of generated JPEGs (4:2:0 and 4:4:4) equal to the same crops of a full decode by Pillow's
libjpeg-turbo, bit for bit (exact IDCT), and the same crops through the entropy index as without it.
"""

from __future__ import annotations

import argparse
import io
import sys


def main() -> None:
    """The checks of the module docstring; an ``AssertionError`` says which failed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect-library", required=True, help="a part of the libjpeg file's path")
    args = parser.parse_args()

    import numpy as np
    import torch
    from PIL import Image

    import lightning_fastdata
    from lightning_fastdata._ext import native
    from lightning_fastdata.loading.jpeg.decode import _decode_crop
    from lightning_fastdata.loading.jpeg.entropy_index import index_file

    where = lightning_fastdata.__file__
    assert "site-packages" in where and sys.prefix in where, f"imported from {where}, not from this venv"
    assert native.jpegroi is not None, "the compiled decoder did not load"
    library = native.libjpeg_path() or ""
    assert args.expect_library in library, f"the decoder calls {library!r}, expected a path with {args.expect_library}"
    rng = np.random.default_rng(0)
    checked = indexed = 0
    for subsampling in (2, 0):
        pixels = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
        pixels = np.cumsum(pixels, axis=1, dtype=np.uint16).astype(np.uint8)  # texture, not noise only
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90, subsampling=subsampling)
        data = buf.getvalue()
        full = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
        index = index_file(data, "check.jpg")
        for _ in range(20):
            h, w = int(rng.integers(16, 240)), int(rng.integers(16, 320))
            top, left = int(rng.integers(0, 240 - h + 1)), int(rng.integers(0, 320 - w + 1))
            box = (top, left, h, w)
            crop = _decode_crop(data, lambda _w, _h, b=box: b, (h, w), exact=True)
            want = torch.from_numpy(full[top : top + h, left : left + w]).permute(2, 0, 1)
            assert torch.equal(crop, want), f"crop {box} differs from Pillow's full decode"
            if index:
                through = _decode_crop(data, lambda _w, _h, b=box: b, (h, w), exact=True, entropy_index=index)
                assert torch.equal(through, want), f"crop {box} through the entropy index differs"
                indexed += 1
            checked += 1
    assert indexed > 0, "no entropy index was built"
    print(f"  decoder: {native.decoder_summary()}")
    print(f"  {checked} crops equal to Pillow's full decode, the same {indexed} times with the entropy index given")


if __name__ == "__main__":
    main()
