"""Fuzz the C code that parses untrusted JPEG bytes: the ROI decoder and the entropy index (``_ext/*.c``).

    python scripts/fuzz_jpeg.py seeds DIR               # write the seed corpus (run without sanitizers)
    python scripts/fuzz_jpeg.py run --ext SO --seeds DIR --seconds 60 --work DIR [--cases N]
    python scripts/fuzz_jpeg.py replay --ext SO CASE_DIR...   # re-run saved cases (the kept reproducers)

``scripts/release.sh`` builds the extension with AddressSanitizer and UndefinedBehaviorSanitizer and runs ``run``
under them (``LD_PRELOAD`` of the sanitizer runtimes, since Python itself is not instrumented); ``run`` imports
nothing but the extension and the standard library, so that every report is about our code. Each case (the
mutated bytes, an index, the call and its arguments) is written to ``WORK/current`` before the call, so that a
crash or a sanitizer report, which ends the process, leaves its reproducer behind; the release script copies it
into ``tests/data/fuzz-reproducers/`` and fails, and ``tests/loading/test_fuzz.py`` replays every case kept there.

Seeds: the libjpeg-turbo test images in ``tests/data/jpeg-corpus`` (IJG licence, see its README) and JPEGs
generated with PIL: photo-like content in sizes from 8 x 8 to 320 x 240, qualities 30-100, 4:4:4, 4:2:2 and 4:2:0,
greyscale, CMYK, progressive, optimised Huffman tables, restart markers; each with its entropy index. Mutations:
truncation, bit and byte flips (often in the headers, where the parsers branch), bytes inserted and deleted,
spliced files, markers overwritten, and damaged indexes (bytes flipped, truncated, another image's index).
Calls: ``header``, ``decode_crop`` (random boxes inside and outside the image, scale 1-16 / 8, ``to_end``, fast
IDCT), ``entropy_index`` (random budgets), ``crop_jpeg`` (random row and column ranges, with a good or a damaged
index) and the decode of what ``crop_jpeg`` returns. Exceptions are the expected outcome of bad input; only a crash
or a sanitizer report fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "jpeg-corpus"


def load_extension(path: str) -> ModuleType:
    """The extension at ``path`` (a sanitizer build outside the package), imported under its own name."""
    spec = importlib.util.spec_from_file_location("lightning_fastdata._ext._jpegroi", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"fuzz_jpeg: cannot load the extension {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_seeds(out: Path) -> int:
    """The seed JPEGs (corpus + generated) into ``out``; returns how many."""
    import io

    import numpy as np

    from lightning_fastdata.demos import photo_like_image

    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(CORPUS.glob("*.jpg")):
        (out / f.name).write_bytes(f.read_bytes())
        n += 1
    rng = np.random.default_rng(0)
    sizes = [(8, 8), (16, 9), (33, 17), (64, 48), (97, 61), (160, 120), (320, 240), (17, 200)]
    for i in range(48):
        w, h = sizes[i % len(sizes)]
        image = photo_like_image(rng, w, h, (i % 8) / 8)
        options: dict[str, Any] = {"quality": int(rng.choice([30, 75, 90, 95, 100]))}
        options["subsampling"] = int(rng.choice([0, 1, 2]))
        if i % 5 == 1:
            options["progressive"] = True
        if i % 3 == 2:
            options["optimize"] = True
        if i % 4 == 3:
            options["restart_marker_rows" if i % 8 == 3 else "restart_marker_blocks"] = int(rng.integers(1, 4))
        if i % 11 == 5:
            image = image.convert("L")
        if i % 13 == 7:
            image = image.convert("CMYK")
        buf = io.BytesIO()
        image.save(buf, "JPEG", **options)
        (out / f"gen_{i:02d}.jpg").write_bytes(buf.getvalue())
        n += 1
    return n


def _mutate(data: bytes, other: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.choice([1, 1, 1, 2, 3, 8])):
        op = rnd.randrange(7)
        if not b:
            break
        if op == 0:  # truncate
            del b[rnd.randrange(len(b)) :]
        elif op == 1:  # a bit flip, often in the headers
            i = rnd.randrange(min(len(b), 700)) if rnd.random() < 0.6 else rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        elif op == 2:  # a byte set to an interesting value
            b[rnd.randrange(len(b))] = rnd.choice([0x00, 0xFF, 0x7F, 0x80, 0x01, 0xD8, 0xD9, 0xDA, 0xDD, 0xC4])
        elif op == 3:  # bytes inserted
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 9)))
        elif op == 4:  # bytes deleted
            i = rnd.randrange(len(b))
            del b[i : i + rnd.randrange(1, 64)]
        elif op == 5:  # spliced with another file
            i, j = rnd.randrange(len(b) + 1), rnd.randrange(len(other) + 1)
            b = b[:i] + bytearray(other[j:])
        else:  # a marker written somewhere
            i = rnd.randrange(len(b))
            b[i : i + 2] = bytes([0xFF, rnd.choice([0xC0, 0xC2, 0xC4, 0xD0, 0xD9, 0xDA, 0xDB, 0xDD, 0xE0])])
    return bytes(b)


def _damage_index(index: bytes, other: bytes, rnd: random.Random) -> bytes:
    b = bytearray(index)
    op = rnd.randrange(4)
    if op == 0 and b:
        del b[rnd.randrange(len(b)) :]
    elif op == 1 and b:
        for _ in range(rnd.randrange(1, 6)):
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
    elif op == 2:
        return other
    elif b:  # a 16- or 32-bit field set to an extreme
        i = rnd.randrange(len(b))
        b[i : i + 4] = rnd.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\x00\x00"])
    return bytes(b)


def run_case(ext: ModuleType, case: dict[str, Any], data: bytes, index: bytes) -> str:
    """One call of the extension; the name of what it raised ("ok" if nothing)."""
    try:
        op, args = case["op"], case["args"]
        if op == "header":
            ext.header(data)
        elif op == "decode_crop":
            top, left, h, w, to_end, scale, fast = args
            buf = bytearray(max(1, h) * (max(1, w) + 66) * 3) if case.get("big_buffer", True) else bytearray(16)
            ext.decode_crop(data, top, left, h, w, buf, to_end, scale, fast)
        elif op == "entropy_index":
            ext.entropy_index(data, *args)
        elif op == "crop_jpeg":
            small = ext.crop_jpeg(data, index, *args)
            if isinstance(small, (bytes, bytearray)) and len(small) > 2:
                width, height, _ = ext.header(small)
                if 0 < width * height <= 1 << 22:
                    ext.decode_crop(small, 0, 0, height, width, bytearray(height * (width + 66) * 3), True, 8, 0)
        return "ok"
    except (OSError, ValueError, KeyError, MemoryError, OverflowError) as err:  # what bad bytes raise (by design)
        return type(err).__name__


def _cases(seed: bytes, index: bytes, rnd: random.Random, ext: ModuleType) -> list[dict[str, Any]]:
    """Calls to make on (mutations of) one seed."""
    try:
        width, height, _ = ext.header(seed)
    except Exception:  # noqa: BLE001
        width, height = 64, 64
    out: list[dict[str, Any]] = [{"op": "header", "args": []}]
    for _ in range(2):
        scale = rnd.choice([8, 8, 4, 2, 1, 16, 3])
        sw, sh = max(1, -(-width * scale // 8)), max(1, -(-height * scale // 8))
        h, w = rnd.randint(1, sh), rnd.randint(1, sw)
        top, left = rnd.randint(0, sh - h), rnd.randint(0, sw - w)
        if rnd.random() < 0.1:  # outside the image
            top, left = top + rnd.choice([1, sh, -1]), left + rnd.choice([0, sw, -2])
        out.append({"op": "decode_crop", "args": [top, left, h, w, rnd.random() < 0.5, scale, rnd.random() < 0.3]})
    out.append({"op": "entropy_index", "args": [rnd.choice([0.015, 1.0, 0.001, 0.5]), rnd.choice([0, 0, 1, 3]), 0.0]})
    if index:
        rows, cols = index_rows_cols(index)
        r0 = rnd.randint(0, max(0, rows - 1))
        c0 = rnd.randint(0, max(0, cols - 1))
        r1, c1 = rnd.randint(r0 + 1, max(r0 + 1, rows)), rnd.randint(c0 + 1, max(c0 + 1, cols))
        if rnd.random() < 0.1:
            r0, r1, c0, c1 = rnd.choice([(-1, 1, 0, 1), (0, rows + 1, 0, 1), (0, 1, cols, cols + 2), (2, 1, 0, 1)])
        out.append({"op": "crop_jpeg", "args": [r0, r1, c0, c1]})
    return out


def index_rows_cols(index: bytes) -> tuple[int, int]:
    """MCU rows and MCUs per row of an index (its header: magic, mcus per row u16, rows u16, ...)."""
    if len(index) < 8:
        return 1, 1
    return max(1, int.from_bytes(index[6:8], "little")), max(1, int.from_bytes(index[4:6], "little"))


def fuzz(ext: ModuleType, seeds_dir: Path, work: Path, seconds: float, seed: int, max_cases: int = 0) -> dict[str, Any]:
    """Mutate and call for ``seconds`` (or ``max_cases`` cases first); returns the counts of outcomes.

    ``max_cases`` makes the same cases for the same ``seed`` on any machine: what a test asserts on.
    """
    work.mkdir(parents=True, exist_ok=True)
    seeds = [p.read_bytes() for p in sorted(seeds_dir.glob("*.jpg"))]
    if not seeds:
        raise SystemExit(f"fuzz_jpeg: no seeds in {seeds_dir}")
    indexes = []
    for s in seeds:
        try:
            built = ext.entropy_index(s, 0.5, 0, 0.0)
        except Exception:  # noqa: BLE001 - a seed the index refuses (progressive, CMYK...)
            built = None
        indexes.append(bytes(built) if built else b"")
    rnd = random.Random(seed)
    counts: dict[str, int] = {}
    cases = 0
    current = work / "current"
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (max_cases and cases >= max_cases):
        k = rnd.randrange(len(seeds))
        seed_bytes, index = seeds[k], indexes[k]
        other = seeds[rnd.randrange(len(seeds))]
        mutate_data = rnd.random() < 0.75
        data = _mutate(seed_bytes, other, rnd) if mutate_data else seed_bytes
        if index and (not mutate_data or rnd.random() < 0.3):
            index = _damage_index(index, indexes[rnd.randrange(len(indexes))], rnd)
        for case in _cases(seed_bytes, index, rnd, ext)[: max_cases - cases if max_cases else None]:
            save_case(current, case, data, index)
            outcome = run_case(ext, case, data, index)
            counts[f"{case['op']}: {outcome}"] = counts.get(f"{case['op']}: {outcome}", 0) + 1
            cases += 1
    took = seconds - max(0.0, end - time.monotonic())
    return {"cases": cases, "seeds": len(seeds), "seconds": took, "outcomes": dict(sorted(counts.items()))}


def save_case(folder: Path, case: dict[str, Any], data: bytes, index: bytes) -> None:
    """One case as three files (``case.json``, ``data.jpg``, ``index.bin``), what ``replay`` reads."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jpg").write_bytes(data)
    (folder / "index.bin").write_bytes(index)
    (folder / "case.json").write_text(json.dumps(case))


def replay(ext: ModuleType, folder: Path) -> str:
    """Run one saved case again; what it raised."""
    case = json.loads((folder / "case.json").read_text())
    return run_case(ext, case, (folder / "data.jpg").read_bytes(), (folder / "index.bin").read_bytes())


def main(argv: list[str] | None = None) -> None:
    """The three commands of the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("seeds")
    p.add_argument("out")
    p = sub.add_parser("run")
    p.add_argument("--ext", required=True)
    p.add_argument("--seeds", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=0, help="stop after this many cases (0: run for --seconds)")
    p = sub.add_parser("replay")
    p.add_argument("--ext", required=True)
    p.add_argument("cases", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "seeds":
        print(f"fuzz_jpeg: {write_seeds(Path(args.out))} seeds in {args.out}")
    elif args.cmd == "run":
        ext = load_extension(args.ext)
        stats = fuzz(ext, Path(args.seeds), Path(args.work), args.seconds, args.seed, args.cases)
        print(f"fuzz_jpeg: {stats['cases']} cases from {stats['seeds']} seeds in {stats['seconds']:.1f} s, no crash")
        print(json.dumps(stats["outcomes"], indent=1))
    else:
        ext = load_extension(args.ext)
        for case in args.cases:
            print(f"{case}: {replay(ext, Path(case))}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
