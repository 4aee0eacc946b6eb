"""Augmentation beyond the crop, every random draw a function of the sample's key.

A user's per-sample transforms in the workers (:mod:`.sample`), batched per-sample policies and batch transforms on
the training device (:mod:`.policies`, :mod:`.ops`, :mod:`.batch`), the key-derived numbers (:mod:`.keyed`).
"""
