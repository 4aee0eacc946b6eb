from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_fastdata.augment import geometry
from lightning_fastdata.augment.geometry import CROP_DRAWS, random_resized_crop_box
from lightning_fastdata.loading.jpeg import decode
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop


def reference(data: bytes, box: tuple[int, int, int, int], size: int, flip: bool = False) -> np.ndarray:
    """What torchvision's PIL transforms produce for the same crop."""
    top, left, h, w = box
    img = Image.open(io.BytesIO(data)).convert("RGB").crop((left, top, left + w, top + h))
    img = img.resize((size, size), Image.BILINEAR)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img).astype(np.int16)


@pytest.fixture(params=["roi", "fallback"], autouse=True)
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs through the compiled ROI decoder and through the pure-Python fallback."""
    if request.param == "fallback":
        monkeypatch.setattr(decode, "_jpegroi", None)
    return str(request.param)


def ours(data: bytes, box: tuple[int, int, int, int], size: int, flip: bool = False) -> np.ndarray:
    out = torch.empty((size, size, 3), dtype=torch.uint8).permute(2, 0, 1)
    decode_resized_crop(data, out, lambda w, h: box, flip=flip, name="x")
    return out.permute(1, 2, 0).numpy().astype(np.int16)


def encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("box", "size", "flip", "tolerance"),
    [
        ((20, 30, 300, 280), 224, False, 1.5),  # ~1.3x downscale: decode_jpeg + torch resize
        ((0, 0, 375, 375), 224, True, 1.5),
        ((50, 60, 120, 90), 224, False, 1.5),  # upscale
        # >= 2x the output: decoded at 1/2 .. 1/8 in the DCT domain, a slightly different low-pass filter
        ((10, 10, 350, 420), 96, False, 2.5),
        ((10, 10, 350, 420), 40, True, 4.0),
    ],
)
def test_fast_path_matches_pil_reference(
    photo: Path, box: tuple[int, int, int, int], size: int, flip: bool, tolerance: float, decoder: str
) -> None:
    data = photo.read_bytes()
    reduction = decode._draft_scale(box, (size, size))
    want = box
    if decoder == "roi" and reduction > 1:
        # the ROI decoder takes a DCT-scaled crop on the scaled image's grid: each edge within reduction / 2 pixels
        want = tuple(v * reduction for v in decode._scaled_box(box, (500, 375), reduction))
        edges = lambda b: (b[0], b[1], b[0] + b[2], b[1] + b[3])  # noqa: E731
        assert all(abs(a - b) <= reduction // 2 for a, b in zip(edges(want), edges(box)))
    diff = np.abs(ours(data, box, size, flip) - reference(data, want, size, flip))
    assert diff.mean() < tolerance, diff.mean()
    assert np.percentile(diff, 99) < 24


@pytest.mark.parametrize(("box", "size"), [((20, 30, 300, 280), 224), ((10, 10, 350, 420), 96), ((0, 0, 375, 500), 40)])
def test_exact_decode_is_the_full_decode_cropped_and_resized(
    photo: Path, box: tuple[int, int, int, int], size: int, decoder: str
) -> None:
    """``exact=True``: torchvision's full ``decode_jpeg``, the same box, torch's antialiased resize, bit for bit.

    The ROI decoder's crop edges included (a crop edge on an iMCU boundary used to differ there: fancy upsampling
    replicates chroma at a decoded region's edge).
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    data = photo.read_bytes()
    top, left, h, w = box
    full = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    crop = full[:, top : top + h, left : left + w].unsqueeze(0).contiguous(memory_format=torch.channels_last)
    want = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True)[0]
    got = torch.empty((3, size, size), dtype=torch.uint8)
    decode_resized_crop(data, got, lambda w_, h_: box, exact=True)
    assert torch.equal(got, want)
    default = torch.empty((3, size, size), dtype=torch.uint8)
    decode_resized_crop(data, default, lambda w_, h_: box)
    mse = float(((default.float() - want.float()) ** 2).mean())
    if decoder == "roi" or decode._draft_scale(box, (size, size)) > 1:  # without it, decode_jpeg unless DCT-scaled
        assert mse > 0  # the default path is a different (faster) decode ...
    assert mse == 0 or 10 * np.log10(255**2 / mse) > 30  # ... of the same picture


@pytest.mark.parametrize("decoder", ["roi"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize(("hw", "size"), [((330, 300), 224), ((120, 90), 224), ((375, 500), 40)])
def test_resize_into_a_batch_slot_is_torchs_antialiased_resize_bit_for_bit(
    hw: tuple[int, int], size: int, dtype: torch.dtype, decoder: str
) -> None:
    """Written straight into the slot (channels-last batch or planar), flipped or not: ``F.interpolate``'s bits."""
    gen = torch.Generator().manual_seed(0)
    hwc = torch.randint(0, 256, (*hw, 3), dtype=torch.uint8, generator=gen).to(dtype)
    crop = hwc.permute(2, 0, 1)  # a decoded image's layout: rows of RGB pixels
    resized = torch.nn.functional.interpolate(
        crop.unsqueeze(0).contiguous(memory_format=torch.channels_last), size=(size, size), mode="bilinear",
        antialias=True,
    )[0]  # fmt: skip
    batches = {
        "channels-last": torch.zeros((3, size, size, 3), dtype=dtype).permute(0, 3, 1, 2),
        "planar": torch.zeros((3, 3, size, size), dtype=dtype),
    }
    for layout, batch in batches.items():
        for flip in (False, True):
            geometry.resize_crop_into(batch[1], crop, flip)
            want = resized.flip(-1) if flip else resized
            assert torch.equal(batch[1], want), (layout, flip)
            assert not batch[0].any() and not batch[2].any(), layout  # the neighbouring slots are untouched
    # another dtype than the slot's goes through F.interpolate and a converting copy
    other = torch.zeros((3, size, size), dtype=torch.float64)
    geometry.resize_crop_into(other, crop, True)
    assert torch.equal(other, resized.flip(-1).to(torch.float64))


@pytest.mark.parametrize("decoder", ["roi"], indirect=True)
def test_dct_scaled_crops_decode_only_their_rows_at_the_reduced_size(photo: Path, decoder: str) -> None:
    # a crop at least twice the output: 1/2 scale, and the box rounded on that grid (edges within a pixel)
    assert decode._draft_scale((10, 10, 350, 420), (112, 112)) == 2
    assert decode._draft_scale((10, 10, 350, 420), (224, 224)) == 1
    assert decode._scaled_box((11, 9, 351, 421), (500, 375), 2) == (6, 5, 175, 210)
    assert decode._scaled_box((0, 0, 375, 500), (500, 375), 8) == (0, 0, 47, 63)  # ceil(375 / 8), ceil(500 / 8)
    scaled = decode._scaled_box((11, 9, 351, 421), (500, 375), 2)
    crop = decode._decode_roi(photo.read_bytes(), scaled, fast_idct=True, scale_num=4).clone()  # a view of scratch
    assert tuple(crop.shape) == (3, 175, 210)
    full = decode._decode_roi(photo.read_bytes(), (12, 10, 350, 420), fast_idct=True)
    half = torch.nn.functional.avg_pool2d(full.float()[None], 2)[0]  # the same region, 2x2 box-filtered
    diff = float((crop.float() - half).abs().mean())  # the DCT's low-pass is not a box filter: close, not equal
    shifted = float((crop.float()[:, 1:, 1:] - half[:, :-1, :-1]).abs().mean())
    assert diff < 8.0 and diff < 0.75 * shifted  # and aligned: one scaled pixel off is clearly worse


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P", "PNG-RGB", "PNG-L"])
def test_other_modes_and_formats_come_out_as_correct_rgb(photo: Path, mode: str) -> None:
    rgb = Image.open(photo).convert("RGB").resize((120, 90))
    if mode.startswith("PNG"):
        data = encode(rgb.convert(mode.split("-")[1]), "PNG")
    elif mode in ("RGBA", "P"):
        data = encode(rgb.convert(mode), "PNG")
    else:
        data = encode(rgb.convert(mode), "JPEG", quality=95)
    box = (0, 0, 90, 120)
    got, want = ours(data, box, 64), reference(data, box, 64)
    assert got.shape == (64, 64, 3)
    assert np.abs(got - want).mean() < 2.5
    if "L" in mode:
        assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_jpeg_raises_naming_the_file(photo: Path, cut: float) -> None:
    data = photo.read_bytes()
    out = torch.empty((3, 32, 32), dtype=torch.uint8)
    with pytest.raises(OSError, match=r"Cannot decode image 'cls/broken\.jpg'.*on_corrupt='skip'"):
        decode_resized_crop(data[: int(len(data) * cut)], out, lambda w, h: (0, 0, h, w), name="cls/broken.jpg")


def test_not_an_image_raises() -> None:
    with pytest.raises(OSError, match="junk.png"):
        decode_resized_crop(
            b"hello", torch.empty((3, 8, 8), dtype=torch.uint8), lambda w, h: (0, 0, h, w), name="junk.png"
        )


def test_pillow_simd_detection_follows_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import PIL

    from lightning_fastdata.loading.jpeg.decode import pillow_simd_installed

    monkeypatch.setattr(PIL, "__version__", "9.5.0.post2")
    assert pillow_simd_installed()
    monkeypatch.setattr(PIL, "__version__", "13.0.0")
    assert not pillow_simd_installed()


@pytest.mark.parametrize("decoder", ["roi"], indirect=True)
def test_roi_decoder_is_built_here(decoder: str) -> None:
    # setup.sh installs libjpeg-turbo's headers; losing the fast path silently would be a regression.
    assert decode.roi_decode_available(), "lightning_fastdata._ext._jpegroi was not built: run bash setup.sh"


def test_progressive_jpeg_crop(photo: Path) -> None:
    data = encode(Image.open(photo), "JPEG", quality=90, progressive=True)
    box = (33, 71, 250, 301)
    assert np.abs(ours(data, box, 160) - reference(data, box, 160)).mean() < 1.5


@pytest.mark.parametrize("cut", [0.9, 0.97])
def test_truncated_jpeg_raises_whatever_the_crop(photo: Path, cut: float) -> None:
    """A file cut short is corrupt for every crop, also those that end before the cut (ROI decode stops early)."""
    data = photo.read_bytes()[: int(photo.stat().st_size * cut)]
    rng = np.random.default_rng(0)
    out = torch.empty((3, 64, 64), dtype=torch.uint8)
    failures = 0
    for _ in range(40):
        box = random_resized_crop_box(rng.random(CROP_DRAWS), 500, 375)
        with pytest.raises(OSError, match="broken.jpg"):
            decode_resized_crop(data, out, lambda w, h, box=box: box, name="broken.jpg")
        failures += 1
    assert failures == 40
    # A top-left crop ends long before the cut: still corrupt.
    with pytest.raises(OSError, match="broken.jpg"):
        decode_resized_crop(data, out, lambda w, h: (0, 0, 64, 64), name="broken.jpg")


def test_trailing_bytes_after_the_image_are_not_corruption(photo: Path) -> None:
    data = photo.read_bytes()
    box = (10, 20, 100, 120)
    padded = data + b"\x00" * 10_000 + b"appended metadata"
    np.testing.assert_array_equal(ours(padded, box, 64), ours(data, box, 64))


def test_decode_bugs_are_not_reported_as_corrupt_images(photo: Path, decoder: str) -> None:
    """A crop box outside the image is our bug, not a bad file: it must not become 'corrupt' (and be skipped)."""
    out = torch.empty((3, 32, 32), dtype=torch.uint8)
    with pytest.raises(Exception) as info:
        decode_resized_crop(photo.read_bytes(), out, lambda w, h: (h - 10, 0, 50, 50), name="good.jpg")
    assert not isinstance(info.value, OSError), info.value
    if decoder == "roi":
        assert "crop box outside the image" in str(info.value)


def test_decompression_bomb_is_a_named_corrupt_file(photo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Larger than PIL's limit: an OSError naming the file for every crop and decode path (so it can be skipped)."""
    png = encode(Image.open(photo), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40_000)  # limit 80,000 px: the 500 x 375 photo is a "bomb"
    data = photo.read_bytes()
    for box, size in (((0, 0, 64, 64), 64), ((0, 0, 375, 500), 32), ((10, 10, 300, 300), 224)):
        with pytest.raises(OSError, match=r"big\.jpg.*decompression.bomb"):
            decode_resized_crop(
                data, torch.empty((3, size, size), dtype=torch.uint8), lambda w, h, b=box: b, name="big.jpg"
            )
    with pytest.raises(OSError, match=r"big\.png.*decompression"):
        decode_resized_crop(png, torch.empty((3, 8, 8), dtype=torch.uint8), lambda w, h: (0, 0, h, w), name="big.png")


def test_decoding_from_threads_gives_the_single_thread_result(photo: Path) -> None:
    """Each thread decodes into its own scratch memory: two loaders in two threads never mix images."""
    import threading

    datas = [photo.read_bytes(), encode(Image.open(photo).transpose(Image.FLIP_TOP_BOTTOM), "JPEG", quality=90)]
    rng = np.random.default_rng(1)
    boxes = [random_resized_crop_box(rng.random(CROP_DRAWS), 500, 375, scale=(0.3, 1.0)) for _ in range(30)]
    expected = {(d, i): ours(datas[d], box, 48) for d in range(2) for i, box in enumerate(boxes)}
    wrong: list[tuple[int, int]] = []

    def work(d: int) -> None:
        for _ in range(5):
            for i, box in enumerate(boxes):
                if not np.array_equal(ours(datas[d], box, 48), expected[(d, i)]):
                    wrong.append((d, i))

    threads = [threading.Thread(target=work, args=(d,)) for d in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} crops differ from the single-thread decode"
