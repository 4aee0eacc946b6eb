"""The tensor cache: images decoded once into uint8 arrays.

The dataset that reads it (:mod:`.dataset`), its build, locked and resumable (:mod:`.build`), the manifest that makes
a folder a current cache (:mod:`.manifest`) and the check that its source folder is unchanged (:mod:`.source`). The
public names are re-exported by ``lightning_fastdata``.
"""
