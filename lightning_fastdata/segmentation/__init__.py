"""Semantic segmentation: the mask target's room.

The mask target kind (:mod:`.target`: decode, follow the image's window, batch, count), where a split's images and
masks are in a folder and what a mask value means (:mod:`.layouts`), the device policies that warp images and masks
(:mod:`.policy`), the decoded cache of masks (:mod:`.cache`), mixes (:mod:`.mixed`), prediction inputs
(:mod:`.predict`), the converter (:mod:`.convert`) and demo data (:mod:`.demos`). The sources its samples come from are
:mod:`lightning_fastdata.sources`'. The public names are re-exported by ``lightning_fastdata``.
"""
