"""What only tests, benchmarks and docs use: a quiet CPU Trainer (:func:`cpu_trainer`).

Never imported by the training path (as ``torch.testing`` is not). The local S3 server and its fault proxy are the
repository's (``benchmarks/s3_server.py``, ``benchmarks/fault_proxy.py``), not installed.
"""

from lightning_fastdata.testing.trainer import cpu_trainer

__all__ = ["cpu_trainer"]
