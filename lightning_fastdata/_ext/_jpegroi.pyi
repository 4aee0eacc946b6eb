def header(data: bytes) -> tuple[int, ...]: ...
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

# the image kernels (imageops.c): buffers are numpy arrays (or any buffer); strides are in bytes, per dimension
def warp(
    src: object,
    src_strides: tuple[int, ...],
    dst: object,
    dst_strides: tuple[int, ...],
    shape: tuple[int, ...],
    bx: object,
    by: object,
    params: object,
    fill: int,
    bilinear: bool = False,
    /,
) -> None: ...
def lookup(
    src: object,
    src_strides: tuple[int, ...],
    dst: object,
    dst_strides: tuple[int, ...],
    shape: tuple[int, ...],
    table: object,
    rows: int,
    /,
) -> None: ...
def hue(
    src: object,
    src_strides: tuple[int, ...],
    dst: object,
    dst_strides: tuple[int, ...],
    shape: tuple[int, ...],
    factor: float,
    /,
) -> None: ...
def histogram(src: object, src_strides: tuple[int, ...], shape: tuple[int, ...], counts: object, /) -> None: ...
def sharpen(
    src: object,
    src_strides: tuple[int, ...],
    dst: object,
    dst_strides: tuple[int, ...],
    shape: tuple[int, ...],
    alpha: float,
    /,
) -> None: ...
def transpose(src: object, dst: object, rows: int, cols: int, /) -> None: ...
def library() -> str | None: ...
