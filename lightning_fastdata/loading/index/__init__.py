"""Index: which samples there are.

The compact file index of an image folder and its scan, the persisted index and its staleness checks, and a
dataset's identity (what a resume state checks). No storage access of its own.
"""
