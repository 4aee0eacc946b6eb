"""The windowed sources: where a sample's image and its target's payload come from, one room per format.

A source lists its samples, reads a group of them with the reads in flight together and says what identifies its data
(:class:`~lightning_fastdata.sources.windowed.WindowedDataset`): a folder or bucket of files
(:mod:`~lightning_fastdata.sources.folder`), one HDF5 file (:mod:`~lightning_fastdata.sources.hdf5`), tar shards
(:mod:`~lightning_fastdata.sources.tar`), Parquet files (:mod:`~lightning_fastdata.sources.parquet`). What rides with
the image is a target kind's (the contract: :mod:`~lightning_fastdata.sources.target`; a mask:
:mod:`~lightning_fastdata.segmentation.target`), and the geometry both follow is
:mod:`~lightning_fastdata.sources.window`'s. A source never decodes a payload; a target never reads storage.
"""
