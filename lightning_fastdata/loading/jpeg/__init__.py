"""JPEG: decoding only what a crop needs.

The decode paths and the entropy index; the compiled extension through its one adapter
(:mod:`~lightning_fastdata._ext.native`).
"""
