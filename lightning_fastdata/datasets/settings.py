"""The augmentation and corrupt-image settings every image dataset takes, validated once, in one frozen object.

The DataModules take the same arguments (``image_size``, ``scale``, ...), check them in their ``__init__`` so that
LightningCLI fails before training starts, and hand them to their datasets: both build an :class:`AugmentSettings`,
so each rule and its message exist once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from lightning_fastdata.errors import InvalidValueError

__all__ = ["AugmentSettings"]


@dataclass(frozen=True)
class AugmentSettings:
    """What a sample's crop, flip and decode depend on, and what happens to an image that does not decode.

    Args:
        image_size: Side of the square output.
        scale: Area range of the random crop, as in ``RandomResizedCrop``.
        ratio: Aspect-ratio range of the random crop.
        crop_fraction: Evaluation crop as a fraction of the shorter side (0.875 is 224 of 256).
        seed: Seed of the per-sample augmentation.
        on_corrupt: ``"raise"`` or ``"skip"`` an image that does not decode.
        exact_decode: Decode JPEGs at full size with the exact IDCT.
        max_corrupt_fraction: With ``"skip"``: the most images an epoch may skip, as a fraction of its samples.

    Raises:
        ValueError: On an impossible value (named, with what is expected).
    """

    image_size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    crop_fraction: float = 0.875
    seed: int = 0
    on_corrupt: Literal["raise", "skip"] = "raise"
    exact_decode: bool = False
    max_corrupt_fraction: float = 0.01

    def __post_init__(self) -> None:
        if isinstance(self.image_size, (tuple, list)):
            raise InvalidValueError(
                f"image_size={tuple(self.image_size)!r}: outputs are squares, so image_size is one int (the side). The "
                "tensor cache and HDF5 files keep square images, and the device crop and the evaluation centre crop "
                "are square. For a (height, width) model input, pass the larger side and crop the batch in your "
                "LightningModule (e.g. images[..., :h, :w])."
            )
        if not isinstance(self.image_size, int) or isinstance(self.image_size, bool) or self.image_size <= 0:
            raise InvalidValueError(f"image_size should be a positive int, got {self.image_size!r}.")
        if not (0 < self.scale[0] <= self.scale[1] <= 1):
            raise InvalidValueError(f"scale should satisfy 0 < min <= max <= 1, got {self.scale!r}.")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise InvalidValueError(f"ratio should satisfy 0 < min <= max, got {self.ratio!r}.")
        if not 0 < self.crop_fraction <= 1:
            raise InvalidValueError(f"crop_fraction should be in (0, 1], got {self.crop_fraction!r}.")
        if self.on_corrupt not in ("raise", "skip"):
            raise InvalidValueError(f"on_corrupt should be 'raise' or 'skip', got {self.on_corrupt!r}.")
        if not 0 <= self.max_corrupt_fraction <= 1:
            raise InvalidValueError(f"max_corrupt_fraction should be in [0, 1], got {self.max_corrupt_fraction!r}.")
        # normalised once: tuples of floats (a YAML list arrives as a list), a plain bool
        object.__setattr__(self, "scale", (float(self.scale[0]), float(self.scale[1])))
        object.__setattr__(self, "ratio", (float(self.ratio[0]), float(self.ratio[1])))
        object.__setattr__(self, "exact_decode", bool(self.exact_decode))
        object.__setattr__(self, "max_corrupt_fraction", float(self.max_corrupt_fraction))

    def as_kwargs(self) -> dict[str, Any]:
        """The settings as the datasets' keyword arguments."""
        return asdict(self)
