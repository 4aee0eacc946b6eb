def header(data: bytes) -> tuple[int, int, int]: ...
def decode_crop(
    data: bytes,
    top: int,
    left: int,
    height: int,
    width: int,
    out: bytearray,
    to_end: bool = False,
    scale_num: int = 8,
    fast_idct: bool = False,
) -> tuple[int, int]: ...
def entropy_index(
    data: bytes, max_fraction: float = 0.015, every: int = 0, min_bytes_per_block: float = 0
) -> bytes | None: ...
def crop_jpeg(data: bytes, index: bytes, row0: int, row1: int, col0: int, col1: int) -> bytes | None: ...
def warp(
    src: object,
    dst: object,
    n: int,
    c: int,
    h: int,
    w: int,
    bx: object,
    by: object,
    params: object,
    fill: int,
    bilinear: bool = False,
) -> None: ...
def lookup(src: object, dst: object, planes: int, plane: int, table: object, rows: int) -> None: ...
def histogram(src: object, counts: object, planes: int, plane: int) -> None: ...
def transpose(src: object, dst: object, rows: int, cols: int) -> None: ...
def library() -> str | None: ...
