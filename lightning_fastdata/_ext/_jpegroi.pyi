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
def entropy_index(data: bytes) -> bytes | None: ...
def crop_jpeg(data: bytes, index: bytes, row0: int, row1: int, col0: int, col1: int) -> bytes | None: ...
