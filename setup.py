"""Builds the optional ROI JPEG decoder; everything else is in pyproject.toml.

The extension links the system libjpeg-turbo (Debian/Ubuntu: ``libjpeg62-turbo-dev`` or ``libjpeg-turbo8-dev``).
If it cannot be built, installation still succeeds and decoding falls back to ``torchvision.io.decode_jpeg``.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build C extensions, but never fail the install because of them."""

    def run(self) -> None:
        """Build all extensions; report instead of failing."""
        try:
            super().run()
        except Exception as err:  # noqa: BLE001 - any compiler/linker failure
            print(f"lightning-fastdata: ROI JPEG decoder not built ({err}); using torchvision's decode_jpeg.")

    def build_extension(self, ext: Extension) -> None:
        """Build one extension; report instead of failing."""
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001
            print(f"lightning-fastdata: ROI JPEG decoder not built ({err}); using torchvision's decode_jpeg.")


setup(
    ext_modules=[
        Extension(
            "lightning_fastdata._ext._jpegroi",
            [f"lightning_fastdata/_ext/{name}.c" for name in ("jpegroi", "jpegindex", "imageops")],
            depends=[f"lightning_fastdata/_ext/{name}.h" for name in ("jpegindex", "imageops")],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # -O3: vectorised loops; imageops.c: no fused multiply-add
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
