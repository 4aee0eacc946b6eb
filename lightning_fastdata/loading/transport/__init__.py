"""Transport: how a batch travels from a worker to the device.

Collate, the shared-memory batch pool and the one module of torch internals it uses, the loaders, and the device
prefetch.
"""
