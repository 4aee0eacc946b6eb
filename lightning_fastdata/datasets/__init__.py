"""Subpackage; the public names are re-exported by ``lightning_fastdata``."""
