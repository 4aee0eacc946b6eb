"""JPEG: decoding only what a crop needs.

The decode paths, the entropy index, and the one adapter to the compiled extension
(:mod:`~lightning_fastdata.loading.jpeg.native`).
"""
