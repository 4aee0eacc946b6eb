"""Data written once from an image folder.

One HDF5 file (:mod:`.hdf5`), WebDataset tars or the hubs' Parquet (:mod:`.shards`). The public names are re-exported
by ``lightning_fastdata``.
"""
