"""Semantic segmentation: the mask target's room.

Where a split's images and masks are and what a mask value means (:mod:`.layouts`), the window an image and its mask
both follow (:mod:`.window`) and the device policies that warp both (:mod:`.policy`), the datasets of each source (a
folder or bucket: :mod:`.dataset`; :mod:`.hdf5`, :mod:`.shards`, :mod:`.parquet`, the decoded :mod:`.cache`), mixes
(:mod:`.mixed`), prediction inputs (:mod:`.predict`), the converter (:mod:`.convert`) and demo data (:mod:`.demos`).
The public names are re-exported by ``lightning_fastdata``.
"""
