"""Every private torchvision API the augmentation room uses, checked once at import.

The room reaches below torchvision's public API in these places, and nowhere else:

- ``v2._utils._get_fill``: a policy's fill argument as one value per image type (the worker policies);
- ``v2.functional._color._blend``, ``_rgb_to_grayscale_image``: the arithmetic of brightness and contrast, applied
  to the 256 levels to make a lookup table (the worker policies);
- ``v2.functional._geometry._get_inverse_affine_matrix``: the matrix torchvision warps by (the worker policies);
- ``v2.functional._color._rgb_to_hsv``, ``_hsv_to_rgb``: the colour-space conversions of ``adjust_hue``, already
  batch-generic (the batched ops);
- ``_AutoAugmentBase._apply_image_or_video_transform`` and the policies' ``_AUGMENTATION_SPACE``: how a policy applies
  one op, and its ops and magnitudes (the worker policies override the first; the batched policies read the
  second, so they draw from torchvision's own table).

:data:`MISSING` names those this torchvision lacks. The fallback: without the worker policies' names,
``accelerate`` (``lightning_fastdata.augment.worker``) leaves a user's policy as torchvision's own object (slower,
the same pixels); without the hue conversions, ``adjust_hue`` runs torchvision's public ``F.adjust_hue`` per
sample; the augmentation spaces have no fallback (the batched policies say so when built). Each behaviour the room
relies on is pinned by a test that compares with torchvision's public ops (``tests/augment/``).
"""

from __future__ import annotations

from typing import Any

from torchvision.transforms import v2

__all__ = [
    "MISSING",
    "WORKER_NAMES",
    "augmentation_space",
    "blend",
    "checks",
    "get_fill",
    "get_inverse_affine_matrix",
    "hsv_to_rgb",
    "rgb_to_grayscale_image",
    "rgb_to_hsv",
]


def _find(module: str, name: str) -> Any:
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None


get_fill: Any = _find("torchvision.transforms.v2._utils", "_get_fill")
blend: Any = _find("torchvision.transforms.v2.functional._color", "_blend")
rgb_to_grayscale_image: Any = _find("torchvision.transforms.v2.functional._color", "_rgb_to_grayscale_image")
get_inverse_affine_matrix: Any = _find("torchvision.transforms.v2.functional._geometry", "_get_inverse_affine_matrix")
rgb_to_hsv: Any = _find("torchvision.transforms.v2.functional._color", "_rgb_to_hsv")
hsv_to_rgb: Any = _find("torchvision.transforms.v2.functional._color", "_hsv_to_rgb")

_POLICIES = (v2.TrivialAugmentWide, v2.RandAugment, v2.AutoAugment, v2.AugMix)


def augmentation_space(policy: type) -> dict[str, Any] | None:
    """``policy._AUGMENTATION_SPACE`` (op name -> (magnitudes(bins, height, width), signed)), or ``None``."""
    space = getattr(policy, "_AUGMENTATION_SPACE", None)
    return space if isinstance(space, dict) else None


def checks() -> dict[str, bool]:
    """Each private name the room uses, and whether this torchvision has it."""
    return {
        "torchvision.transforms.v2._utils._get_fill": get_fill is not None,
        "torchvision.transforms.v2.functional._color._blend": blend is not None,
        "torchvision.transforms.v2.functional._color._rgb_to_grayscale_image": rgb_to_grayscale_image is not None,
        "torchvision.transforms.v2.functional._geometry._get_inverse_affine_matrix": (
            get_inverse_affine_matrix is not None
        ),
        "torchvision.transforms.v2.functional._color._rgb_to_hsv": rgb_to_hsv is not None,
        "torchvision.transforms.v2.functional._color._hsv_to_rgb": hsv_to_rgb is not None,
        "v2 policies' _apply_image_or_video_transform": all(
            callable(getattr(p, "_apply_image_or_video_transform", None)) for p in _POLICIES
        ),
        "v2.TrivialAugmentWide._AUGMENTATION_SPACE": augmentation_space(v2.TrivialAugmentWide) is not None,
        "v2.RandAugment._AUGMENTATION_SPACE": augmentation_space(v2.RandAugment) is not None,
    }


#: The private APIs above that this torchvision lacks; empty when every fast path can be used.
MISSING: list[str] = [name for name, present in checks().items() if not present]

#: The names the worker policies need (without any of them, ``accelerate`` leaves torchvision's policies as they are).
WORKER_NAMES = (
    "torchvision.transforms.v2._utils._get_fill",
    "torchvision.transforms.v2.functional._color._blend",
    "torchvision.transforms.v2.functional._color._rgb_to_grayscale_image",
    "torchvision.transforms.v2.functional._geometry._get_inverse_affine_matrix",
    "v2 policies' _apply_image_or_video_transform",
)
