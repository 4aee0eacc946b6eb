"""Entropy indexes: crops decoded from their own bits are the pixels of the usual decode, bit for bit."""

from __future__ import annotations

import io
import logging
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.augment import geometry
from lightning_fastdata.demos import make_image_folder, photo_like_image
from lightning_fastdata.loading.index.files import scan_image_folder
from lightning_fastdata.loading.jpeg import decode
from lightning_fastdata.loading.jpeg.entropy_index import (
    entropy_index_available,
    entropy_index_folder,
    load_entropy_index,
)
from lightning_fastdata.loading.jpeg.entropy_index_build import build_entropy_index
from lightning_fastdata.loading.jpeg.pieces import piece_files, pieces_folder
from lightning_fastdata.loading.storage.local import LocalStorage

pytestmark = pytest.mark.skipif(not entropy_index_available(), reason="needs the compiled JPEG decoder")


def jpeg(size: tuple[int, int], seed: int = 0, **save: object) -> bytes:
    buf = io.BytesIO()
    image = photo_like_image(np.random.default_rng(seed), size[0], size[1], 0.3 + 0.1 * seed)
    image.convert(str(save.pop("mode", "RGB"))).save(buf, "JPEG", **save)
    return buf.getvalue()


def crop(data: bytes, box: tuple[int, int, int, int], size: int, exact: bool, index: bytes | None) -> torch.Tensor:
    out = torch.empty(3, size, size, dtype=torch.uint8)
    decode.decode_resized_crop(data, out, lambda w, h: box, exact=exact, entropy_index=index)
    return out


def boxes(width: int, height: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """Random crops, and crops whose edges sit on, beside and one pixel off the 16-pixel MCU grid and the image's."""
    out = [geometry.random_resized_crop_box(rng.random(geometry.CROP_DRAWS), width, height) for _ in range(24)]
    for top, left in ((0, 0), (16, 16), (15, 17), (17, 31), (32, 1)):
        for h, w in ((16, 16), (height - top, width - left), (47, 33), (height - top - 1, width - left - 2)):
            if h > 0 and w > 0 and top + h <= height and left + w <= width:
                out.append((top, left, h, w))
    return out


@pytest.mark.parametrize(
    "kind, data",
    [
        ("4:2:0, 500x375", jpeg((500, 375), 0, quality=90)),
        ("4:2:0, odd size 333x251", jpeg((333, 251), 1, quality=85)),
        ("4:4:4", jpeg((257, 190), 2, quality=95, subsampling=0)),
        ("4:2:2", jpeg((300, 201), 3, quality=90, subsampling=1)),
        ("grey", jpeg((211, 150), 4, quality=90, mode="L")),
        ("optimised Huffman tables", jpeg((320, 240), 5, quality=90, optimize=True)),
        ("a restart interval of one MCU row", jpeg((500, 375), 6, quality=90, restart_marker_rows=1)),
        ("a restart interval of two MCU rows", jpeg((333, 251), 7, quality=75, restart_marker_rows=2)),
    ],
)
def test_crops_from_the_index_are_the_usual_decodes_pixels(kind: str, data: bytes) -> None:
    index = decode._jpegroi.entropy_index(data)
    assert index is not None, kind
    width, height, _ = decode._jpegroi.header(data)
    used = 0
    for box in boxes(width, height, np.random.default_rng(0)):
        for size, exact in ((224, True), (224, False), (64, False)):
            want = crop(data, box, size, exact, None)
            got = crop(data, box, size, exact, index)
            assert torch.equal(got, want), (kind, box, size, exact)
        per_row, rows, mcu_w, mcu_h, _ = decode._index_geometry(index)  # type: ignore[misc]
        r0, r1 = decode._mcu_span(box[0], box[2], mcu_h, rows, 2)
        c0, c1 = decode._mcu_span(box[1], box[3], mcu_w, per_row, 2)
        partial = (r1 - r0) * (c1 - c0) < rows * per_row
        used += partial and decode._jpegroi.crop_jpeg(data, index, r0, r1, c0, c1) is not None
    assert used >= 10, f"the index path was taken for only {used} crops of {kind}"  # not all fell back


@pytest.mark.parametrize("restarts", [0, 1])
def test_an_entry_every_k_mcus_gives_the_same_pixels_for_every_k(restarts: int) -> None:
    """Sparse entries: a crop's rows are reached from the entry before their first and last MCU, for any K."""
    data = jpeg((333, 251), 8, quality=90, restart_marker_rows=restarts)
    width, height, _ = decode._jpegroi.header(data)
    per_row = -(-width // 16)
    rng = np.random.default_rng(1)
    crops = [geometry.random_resized_crop_box(rng.random(geometry.CROP_DRAWS), width, height) for _ in range(12)] + [
        (0, 0, 40, width)
    ]
    want = [crop(data, box, 64, False, None) for box in crops]
    sizes = []
    for every in (1, 2, 3, 5, per_row - 1, per_row):
        index = decode._jpegroi.entropy_index(data, 0.015, every)
        assert index is not None and index[10] == every
        sizes.append(len(index))
        for box, pixels in zip(crops, want, strict=True):
            assert torch.equal(crop(data, box, 64, False, index), pixels), (every, box)
        assert decode._jpegroi.crop_jpeg(data, index, 2, 5, 3, per_row) is not None  # to the row's end
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 10 * sizes[-1]


def test_the_index_keeps_within_its_share_of_the_files_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry per MCU was 7-16% of these files; K is chosen per file to stay within INDEX_FRACTION (1.5%).
    Files whose entropy data is too sparse for an index to pay (flat content, a low quality, tiny photos) get
    none by default."""
    from benchmarks.matrix import flat_image
    from lightning_fastdata.loading.jpeg import entropy_index
    from lightning_fastdata.loading.jpeg.entropy_index import INDEX_FRACTION, index_file

    monkeypatch.setattr(entropy_index, "INDEX_MIN_BYTES_PER_BLOCK", 16.0)  # the default (conftest lowers it)
    flat = io.BytesIO()
    flat_image(np.random.default_rng(0), 800, 600).save(flat, "JPEG", quality=90)
    for sparse in (flat.getvalue(), jpeg((320, 240), 1, quality=75), jpeg((96, 72), 2, quality=90)):
        assert decode._jpegroi.entropy_index(sparse) is not None and index_file(sparse, "x.jpg") == b""
    for data in (
        jpeg((500, 375), 0, quality=90),
        jpeg((640, 480), 1, quality=90, restart_marker_rows=1),
        jpeg((1000, 750), 2, quality=95),
        jpeg((400, 300), 3, quality=90, subsampling=0),
    ):
        dense = decode._jpegroi.entropy_index(data, 1.0, 1)
        index = index_file(data, "x.jpg")
        assert dense is not None and len(dense) > 0.05 * len(data)
        assert len(index) <= INDEX_FRACTION * len(data) and index[10] > 1
        assert len(index) > INDEX_FRACTION / 2 * len(data)  # the fewest MCUs per entry within it, not more
    with pytest.raises(ValueError, match="every"):
        decode._jpegroi.entropy_index(jpeg((64, 48)), 0.015, -1)


def test_the_assembled_jpeg_holds_the_crop_alone() -> None:
    data = jpeg((500, 375), 0, quality=90)
    index = decode._jpegroi.entropy_index(data)
    small = decode._jpegroi.crop_jpeg(data, index, 3, 9, 5, 12)  # MCU rows 3..8, columns 5..11
    assert small is not None and len(small) < len(data) / 3
    image = Image.open(io.BytesIO(small))
    assert image.size == (7 * 16, 6 * 16)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int16)
    part = np.asarray(image.convert("RGB")).astype(np.int16)
    inner = (slice(8, -8), slice(8, -8))  # away from its edges, where the chroma upsampling lacks neighbours
    assert np.array_equal(part[inner], full[48:144, 80:192][inner])


def test_files_the_index_cannot_serve_have_none_and_decode_as_before() -> None:
    progressive = jpeg((200, 150), 0, quality=90, progressive=True)
    restarts = jpeg((200, 150), 1, quality=90, restart_marker_blocks=5)  # intervals that end inside MCU rows
    png = io.BytesIO()
    Image.new("RGB", (40, 30), (1, 2, 3)).save(png, "PNG")
    for data in (progressive, restarts, png.getvalue(), b"\xff\xd8\xff\xe0 not really a jpeg"):
        assert decode._jpegroi.entropy_index(data) is None
    assert decode._jpegroi.entropy_index(jpeg((200, 150), 2)[:5000]) is None  # cut short: no index


def test_a_changed_file_is_decoded_without_its_stale_index(caplog: pytest.LogCaptureFixture) -> None:
    old = jpeg((320, 240), 0, quality=90)
    new = jpeg((320, 240), 1, quality=90)  # same geometry, other bytes: as if the file were replaced
    index = decode._jpegroi.entropy_index(old)
    box = (40, 50, 120, 150)
    decode._STALE_WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
        got = crop(new, box, 96, False, index)
    assert torch.equal(got, crop(new, box, 96, False, None))
    assert "built from other bytes" in caplog.text
    with pytest.raises(KeyError):
        decode._jpegroi.crop_jpeg(new, index, 0, 2, 0, 2)
    with pytest.raises(ValueError, match="outside"):
        decode._jpegroi.crop_jpeg(old, index, 0, 99, 0, 2)


def test_built_index_is_kept_in_index_dir_reused_and_rebuilt_when_the_files_change(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=5, size=(96, 72))
    Image.new("RGB", (40, 30)).save(root / "class_001" / "flat.png")
    before = sorted(p.stat().st_mtime_ns for p in root.rglob("*"))
    index = scan_image_folder(str(root))
    built = build_entropy_index(index, LocalStorage(str(root)), tmp_path / "idx", processes=2, progress=False)
    assert len(built) == len(index) == 11
    entries = [built.get(i) for i in range(len(index))]
    assert sum(e is None for e in entries) == 1  # the PNG
    for i, entry in enumerate(entries):
        data = (root / index.relpath(i)).read_bytes()
        assert entry == decode._jpegroi.entropy_index(data) or (entry is None and not data.startswith(b"\xff\xd8"))
    folder = entropy_index_folder(tmp_path / "idx", index)
    stamp = (folder / "meta.json").stat().st_mtime_ns
    again = build_entropy_index(index, LocalStorage(str(root)), tmp_path / "idx", processes=2, progress=False)
    assert (folder / "meta.json").stat().st_mtime_ns == stamp and again.get(0) == entries[0]  # reused
    assert sorted(p.stat().st_mtime_ns for p in root.rglob("*")) == before  # the data is read-only to us
    (root / "class_000" / "img_extra.jpg").write_bytes(jpeg((64, 48)))
    grown = scan_image_folder(str(root))
    assert load_entropy_index(tmp_path / "idx", grown) is None  # another file list: not served
    rebuilt = build_entropy_index(grown, LocalStorage(str(root)), tmp_path / "idx", processes=1, progress=False)
    assert len(rebuilt) == 12 and not list((tmp_path / "idx").glob("*.partial-*"))


def test_datamodule_batches_are_the_same_with_the_index_through_worker_processes(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=12, size=(160, 120))
    common = dict(image_size=64, batch_size=8, num_workers=2, val_fraction=0.25, seed=3)
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        ImageFolderDataModule(str(root), entropy_index="yes", **common)  # type: ignore[arg-type]
    plain = ImageFolderDataModule(str(root), entropy_index=False, **common)
    fast = ImageFolderDataModule(str(root), index_dir=str(tmp_path / "idx"), entropy_index=True, **common)
    fast.prepare_data()
    assert list((tmp_path / "idx").glob("entropy-*/meta.json"))
    for dm in (plain, fast):
        dm.setup("fit")
    assert fast.train_dataset.entropy_indexes is not None and len(fast.train_dataset.entropy_indexes) == 18
    assert fast.train_dataset.entropy_index_of(0) is not None
    batches = [list(dm.train_dataloader()) for dm in (plain, fast)]
    assert len(batches[0]) == len(batches[1]) == 3
    for (xa, ya), (xb, yb) in zip(*batches, strict=True):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_damaged_files_and_indexes_never_crash_and_a_damaged_index_is_refused() -> None:
    data = jpeg((240, 180), 0, quality=90)
    rng = np.random.default_rng(0)
    for _ in range(300):  # damaged files: an index or None, and a crop decoded or refused as corrupt data
        bad = bytearray(data)
        for at in rng.integers(200, len(bad), size=int(rng.integers(1, 6))):
            bad[at] = int(rng.integers(0, 256))
        index = decode._jpegroi.entropy_index(bytes(bad))
        if index is not None:
            try:
                crop(bytes(bad), (30, 40, 100, 120), 48, False, index)
            except OSError:
                pass
    index = decode._jpegroi.entropy_index(data)
    for _ in range(50):  # a damaged index (a flipped bit in its entries) is refused, never followed
        damaged = bytearray(index)
        at = int(rng.integers(32, len(damaged)))
        damaged[at] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(KeyError):
            decode._jpegroi.crop_jpeg(data, bytes(damaged), 1, 5, 1, 6)
    assert torch.equal(
        crop(data, (30, 40, 100, 120), 48, False, bytes(damaged)), crop(data, (30, 40, 100, 120), 48, False, None)
    )
    wide = jpeg((500, 375), 1, quality=90)  # 32 MCUs a row: K = 11 and K = 12 both give 3 entries a row
    moved = bytearray(decode._jpegroi.entropy_index(wide, 0.015, 11) or b"")
    moved[10] = 12  # every entry would be read at another MCU: refused (the hash covers the geometry)
    with pytest.raises(KeyError):
        decode._jpegroi.crop_jpeg(wide, bytes(moved), 1, 5, 13, 30)


def _built(tmp_path: Path) -> tuple[Path, object, Path]:
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=6, size=(160, 120))
    index = scan_image_folder(str(root))
    build_entropy_index(index, LocalStorage(str(root)), tmp_path / "idx", processes=1, progress=False)
    return root, index, entropy_index_folder(tmp_path / "idx", index)


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


DAMAGES = {
    "empty blob": lambda f: (f / "blob.bin").write_bytes(b""),
    "truncated blob": lambda f: _truncate(f / "blob.bin", 100),
    "empty offsets": lambda f: (f / "offsets.npy").write_bytes(b""),
    "truncated offsets": lambda f: _truncate(f / "offsets.npy", 70),
    "offsets past the blob": lambda f: np.save(f / "offsets.npy", np.load(f / "offsets.npy") * 3),
    "offsets out of order": lambda f: np.save(f / "offsets.npy", np.load(f / "offsets.npy")[::-1].copy()),
    "garbage meta": lambda f: (f / "meta.json").write_text("[1, 2"),
    "meta not an object": lambda f: (f / "meta.json").write_text("[1, 2]"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_index_folder_is_named_once_decoded_without_and_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Truncated, empty or inconsistent index files never stop a run: one warning naming the folder and why, the
    same batches as without an index, and prepare_data rebuilds it."""
    from lightning_fastdata.loading.jpeg import entropy_index as module

    root, index, folder = _built(tmp_path)
    DAMAGES[damage](folder)
    module._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
        assert load_entropy_index(tmp_path / "idx", index) is None  # type: ignore[arg-type]
        assert load_entropy_index(tmp_path / "idx", index) is None  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(warnings) == 1 and str(folder) in warnings[0], caplog.text
    common = dict(image_size=64, batch_size=4, num_workers=0, val_fraction=0.0, seed=1)
    damaged = ImageFolderDataModule(str(root), index_dir=str(tmp_path / "idx"), entropy_index=True, **common)
    damaged.setup("fit")  # no prepare_data: the damaged folder is what setup finds
    assert damaged.train_dataset.entropy_indexes is None
    plain = ImageFolderDataModule(str(root), **common)
    plain.setup("fit")
    for (xa, ya), (xb, yb) in zip(plain.train_dataloader(), damaged.train_dataloader(), strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    damaged.prepare_data()  # rebuilds the damaged folder
    assert load_entropy_index(tmp_path / "idx", index) is not None  # type: ignore[arg-type]


def test_damaged_or_foreign_entries_are_decoded_without_the_index_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An entry cut short, with wrong MCU counts or MCU size, or another image's: the usual pixels, one warning
    naming the file."""
    data, other = jpeg((320, 240), 0, quality=90), jpeg((480, 200), 1, quality=90)
    index = decode._jpegroi.entropy_index(data)
    box = (40, 50, 120, 150)
    expected = crop(data, box, 96, False, None)
    wrong_counts = bytearray(index)
    wrong_counts[4:6] = (7).to_bytes(2, "little")  # MCUs per row
    wrong_size = bytearray(index)
    wrong_size[8] = 8  # MCU width 8 instead of 16
    cases = [b"", index[:5], index[:-10], bytes(wrong_counts), bytes(wrong_size), decode._jpegroi.entropy_index(other)]
    for entry in cases:
        decode._STALE_WARNED.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
            out = torch.empty(3, 96, 96, dtype=torch.uint8)
            decode.decode_resized_crop(data, out, lambda w, h: box, name="cat/0001.jpg", entropy_index=entry)
        assert torch.equal(out, expected)
        assert "cat/0001.jpg" in caplog.text and "does not match" in caplog.text


def test_an_unwritable_index_dir_warns_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """index_dir that cannot be created (a file is in the way), or whose lock cannot be taken: a warning, an
    existing whole index used, else none; never an OSError out of prepare_data."""
    from lightning_fastdata.loading.jpeg import entropy_index as module

    root, index, folder = _built(tmp_path)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    module._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
        got = build_entropy_index(index, LocalStorage(str(root)), blocked / "idx", processes=1, progress=False)  # type: ignore[arg-type]
    assert got is None and "cannot write the entropy index" in caplog.text and "training without it" in caplog.text
    lock = Path(f"{folder}.lock")
    lock.unlink()
    lock.mkdir()  # the lock cannot be taken (as in a read-only index_dir)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
        got = build_entropy_index(index, LocalStorage(str(root)), tmp_path / "idx", processes=1, progress=False)  # type: ignore[arg-type]
    assert got is not None and len(got) == len(index) and "using the index already there" in caplog.text  # type: ignore[arg-type]
    common = dict(image_size=64, batch_size=4, val_fraction=0.0, num_workers=0)
    dm = ImageFolderDataModule(str(root), index_dir=str(blocked / "idx"), entropy_index=True, **common)
    dm.prepare_data()  # neither the file list nor the entropy index can be kept: warned, not raised
    dm.setup("fit")
    assert dm.train_dataset.entropy_indexes is None and len(list(dm.train_dataloader())) == 3


def test_leftovers_of_killed_builds_are_removed_by_the_next_build(tmp_path: Path) -> None:
    root, index, folder = _built(tmp_path)
    for leftover in (f"{folder.name}.partial-999999", f"{folder.name}.stale-999998"):
        (folder.parent / leftover).mkdir()
        (folder.parent / leftover / "blob.bin").write_bytes(b"x" * 100)
    (folder / "meta.json").unlink()  # so that the next call builds
    build_entropy_index(index, LocalStorage(str(root)), tmp_path / "idx", processes=1, progress=False)  # type: ignore[arg-type]
    assert sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(folder.name)) == [
        folder.name,
        f"{folder.name}.lock",
    ]


def _wait_for(path: Path, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), path


def test_auto_builds_in_the_background_in_the_user_cache_and_is_taken_up_with_the_same_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default, entropy_index="auto": prepare_data returns at once, the index is built in the per-user cache
    folder by a background process, and the dataset takes it up when whole: the same batches before, after and
    without it."""
    from lightning_fastdata.loading.jpeg.entropy_index import PendingEntropyIndex, default_index_dir

    monkeypatch.setenv("LIGHTNING_FASTDATA_CACHE", str(tmp_path / "cache"))
    assert default_index_dir() == tmp_path / "cache" / "entropy-index"
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=12, size=(160, 120))
    common = dict(image_size=64, batch_size=8, num_workers=0, val_fraction=0.0, seed=3)
    auto = ImageFolderDataModule(str(root), **common)
    assert auto.entropy_index == "auto"  # the default
    started = time.monotonic()
    auto.prepare_data()
    assert time.monotonic() - started < 5  # no pass over the files before the first step
    auto.setup("fit")
    pending = auto.train_dataset.entropy_indexes
    assert isinstance(pending, PendingEntropyIndex) and pending.folder.parent == default_index_dir()
    plain = ImageFolderDataModule(str(root), entropy_index=False, **common)
    plain.setup("fit")
    expected = list(plain.train_dataloader())
    before = list(auto.train_dataloader())
    _wait_for(pending.folder / "meta.json")
    pending._next = 0.0  # look now rather than in 20 s
    assert auto.train_dataset.entropy_index_of(0) is not None  # taken up
    after = list(auto.train_dataloader())
    for batches in (before, after):
        for (xa, ya), (xb, yb) in zip(expected, batches, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not list(pending.folder.parent.glob("*.partial-*"))


def test_builders_of_one_index_build_it_once_and_an_unwritable_cache_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from lightning_fastdata.loading.jpeg import entropy_index as module
    from lightning_fastdata.loading.jpeg import entropy_index_build as build

    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=10, size=(160, 120))
    index = scan_image_folder(str(root))
    builders = [build.start_background_build(index, LocalStorage(str(root)), tmp_path / "idx") for _ in range(2)]
    for process in builders:
        process.join(120)
        assert process.exitcode == 0
    folder = entropy_index_folder(tmp_path / "idx", index)
    stamp = (folder / "meta.json").stat().st_mtime_ns
    assert build.start_background_build(index, LocalStorage(str(root)), tmp_path / "idx") is None  # whole: nothing
    assert (folder / "meta.json").stat().st_mtime_ns == stamp and load_entropy_index(tmp_path / "idx", index)
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("LIGHTNING_FASTDATA_CACHE", str(tmp_path / "a-file"))
    module._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_fastdata"):
        assert build.start_background_build(index, LocalStorage(str(root)), module.default_index_dir()) is None
    assert "cannot keep an entropy index" in caplog.text
    dm = ImageFolderDataModule(str(root), entropy_index="auto", image_size=64, val_fraction=0.0, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    assert len(list(dm.train_dataloader())) > 0


class _CountingStorage(LocalStorage):
    """A folder whose reads are counted, and which fails (as a killed build stops) after ``fail_after`` files."""

    def __init__(self, root: str, fail_after: int | None = None) -> None:
        super().__init__(root)
        self.read = 0
        self.fail_after = fail_after

    def read_many(self, relpaths):  # type: ignore[no-untyped-def]
        out = []
        for data in super().read_many(relpaths):
            if self.fail_after is not None and self.read >= self.fail_after:
                raise RuntimeError("killed")
            self.read += 1
            out.append(data)
        return out


def test_a_killed_build_resumes_at_its_last_whole_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fastdata.loading.jpeg import entropy_index_build as build

    monkeypatch.setattr(build, "piece_files", lambda count: 4)
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=9, size=(96, 72))
    index = scan_image_folder(str(root))
    killed = _CountingStorage(str(root), fail_after=10)
    with pytest.raises(RuntimeError, match="killed"):
        build_entropy_index(index, killed, tmp_path / "idx", processes=0, progress=False)
    folder = entropy_index_folder(tmp_path / "idx", index)
    building = folder.with_name(f"{folder.name}.building")
    assert not (folder / "meta.json").exists() and len(list(building.glob("*.npy"))) == 2
    again = _CountingStorage(str(root))
    built = build_entropy_index(index, again, tmp_path / "idx", processes=0, progress=False)
    assert again.read == len(index) - 8  # the two whole pieces of 4 were kept
    fresh = build_entropy_index(index, LocalStorage(str(root)), tmp_path / "fresh", processes=1, progress=False)
    assert built is not None and fresh is not None
    assert [built.get(i) for i in range(len(index))] == [fresh.get(i) for i in range(len(index))]
    assert not building.exists()


def test_loaders_use_the_finished_pieces_of_a_build_before_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the index is built, the files of its finished pieces are decoded with their entries (the same ones
    as the whole index's, the same pixels); the others without; the whole index is taken up when it is there."""
    from lightning_fastdata.loading.jpeg import entropy_index as module
    from lightning_fastdata.loading.jpeg import entropy_index_build as build

    monkeypatch.setattr(build, "piece_files", lambda count: 4)
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=9, size=(320, 240))
    dm = ImageFolderDataModule(
        str(root), entropy_index=False, image_size=64, batch_size=6, num_workers=0, val_fraction=0.0, seed=1
    )
    dm.setup("fit")
    index = dm.train_dataset.index
    whole = build_entropy_index(index, LocalStorage(str(root)), tmp_path / "whole", processes=0, progress=False)
    assert whole is not None
    expected = [whole.get(i) for i in range(len(index))]
    assert all(e is not None for e in expected[:8])
    pending = module.PendingEntropyIndex(tmp_path / "idx", index)
    assert [pending.get(i) for i in range(len(index))] == [None] * len(index)  # nothing built yet
    with pytest.raises(RuntimeError, match="killed"):  # a build stopped after two whole pieces of 4
        build_entropy_index(index, _CountingStorage(str(root), fail_after=10), tmp_path / "idx", 0, progress=False)
    assert [pending.get(i) for i in range(len(index))] == [None] * len(index)  # not looked again within 5 s
    pending._next = 0.0
    assert [pending.get(i) for i in range(len(index))] == expected[:8] + [None] * (len(index) - 8)
    assert pending.covered() == 8
    forked = pickle.loads(pickle.dumps(pending))  # a worker's copy looks for itself
    assert forked._pieces is None and forked.get(3) == expected[3]
    without = list(dm.train_dataloader())
    dm.train_dataset.entropy_indexes = pending
    assert [dm.train_dataset.entropy_index_of(i) for i in range(len(index))][:9] == expected[:8] + [None]
    with_pieces = list(dm.train_dataloader())
    for (xa, ya), (xb, yb) in zip(without, with_pieces, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    build_entropy_index(index, LocalStorage(str(root)), tmp_path / "idx", processes=0, progress=False)
    assert not pieces_folder(pending.folder).exists()  # joined and removed: the pieces taken up stay readable
    assert [pending.get(i) for i in range(len(index))] == expected[:8] + [None] * (len(index) - 8)
    assert pending.covered() == len(index)  # a look at once: the whole index
    assert [pending.get(i) for i in range(len(index))] == expected and pending._pieces is None


def test_pieces_of_another_file_list_are_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_fastdata.loading.jpeg import entropy_index as module
    from lightning_fastdata.loading.jpeg import entropy_index_build as build

    monkeypatch.setattr(build, "piece_files", lambda count: 4)
    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=6, size=(160, 120))
    old = scan_image_folder(str(root))
    with pytest.raises(RuntimeError, match="killed"):
        build_entropy_index(old, _CountingStorage(str(root), fail_after=9), tmp_path / "idx", 0, progress=False)
    (root / "class_000" / "img_extra.jpg").write_bytes(jpeg((160, 120)))
    grown = scan_image_folder(str(root))
    pending = module.PendingEntropyIndex(tmp_path / "idx", grown)
    assert pending.get(0) is None and pending._pieces is not None and pending._pieces.covered == 0
    assert module.PendingEntropyIndex(tmp_path / "idx", old).get(0) is not None


def test_piece_sizes_take_a_small_list_up_in_steps_and_a_large_one_in_few_bounded_pieces() -> None:
    """A 32nd of the list, 64 files at least, 65,536 at most: ImageNet's 1.28 million files in 32 pieces (each
    loader process maps each piece it takes up: one file descriptor a piece), ten million in 153."""
    assert [piece_files(n) for n in (1, 1536, 2048 * 32, 1_281_167, 10_000_000)] == [64, 64, 2048, 40037, 65536]
    assert -(-10_000_000 // piece_files(10_000_000)) == 153


def test_auto_builds_nothing_unasked_for_a_bucket_and_true_builds_it(
    s3: object, s3_image_folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket root with the default: no background read of every object (egress); entropy_index=True builds the
    index from the bucket, and then the default uses it."""
    from lightning_fastdata.loading.jpeg.entropy_index import EntropyIndexes

    monkeypatch.setenv("LIGHTNING_FASTDATA_CACHE", str(tmp_path / "cache"))
    common = dict(storage_options=s3.storage_options(), image_size=32, val_fraction=0.0, num_workers=0)  # type: ignore[attr-defined]
    auto = ImageFolderDataModule(s3_image_folder, **common)
    auto.prepare_data()
    time.sleep(1.0)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("meta.json"))
    built = ImageFolderDataModule(s3_image_folder, entropy_index=True, **common)
    built.prepare_data()
    auto.setup("fit")
    pending = auto.train_dataset.entropy_indexes
    assert pending is not None and pending.get(0) is not None  # the index built from the bucket, taken up
    assert isinstance(pending._found, EntropyIndexes)  # type: ignore[union-attr]


def test_the_same_relative_root_in_two_projects_gets_two_index_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = []
    for project in ("a", "b"):
        make_image_folder(tmp_path / project / "data", num_classes=1, per_class=2, size=(64, 48), seed=len(project))
        monkeypatch.chdir(tmp_path / project)
        folders.append(entropy_index_folder(tmp_path / "cache", scan_image_folder("data")))
    assert folders[0] != folders[1]


def test_a_pending_index_checks_a_folder_against_the_list_only_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader workers look every 5 s; an older index of another list sitting there is fingerprinted once, not
    at every look, and the rebuilt one is taken up when its meta.json changes."""
    from lightning_fastdata.loading.jpeg import entropy_index as module

    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=4, size=(96, 72))
    old = scan_image_folder(str(root))
    build_entropy_index(old, LocalStorage(str(root)), tmp_path / "idx", processes=1, progress=False)
    (root / "class_000" / "img_extra.jpg").write_bytes(jpeg((64, 48)))
    grown = scan_image_folder(str(root))
    checks: list[int] = []
    real_valid = module.why_unusable
    monkeypatch.setattr(module, "why_unusable", lambda folder, index: checks.append(1) or real_valid(folder, index))
    pending = module.PendingEntropyIndex(tmp_path / "idx", grown)
    for _ in range(3):
        pending._next = 0.0
        assert pending.get(0) is None
    assert len(checks) == 1  # the other list's index, checked once
    build_entropy_index(grown, LocalStorage(str(root)), tmp_path / "idx", processes=1, progress=False)
    pending._next = 0.0
    assert pending.get(0) is not None
