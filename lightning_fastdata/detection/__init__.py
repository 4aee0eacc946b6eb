"""Object detection: the box target's room.

The box target kind (:mod:`.target`: annotations decoded, boxes through the image's window, packed batches, target
dicts on the device), where a split's images and annotations are in COCO's, VOC's and YOLO's layouts (:mod:`.layouts`),
torchvision's detection recipes as windows (:mod:`.recipes`), the DataModule (:mod:`.datamodule`) and demo data
(:mod:`.demos`). The sources its samples come from are :mod:`lightning_fastdata.sources`'; no source knows boxes.
"""
