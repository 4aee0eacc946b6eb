"""What only tests, benchmarks and docs use: a quiet CPU Trainer, a real local S3 server, a fault proxy.

Never imported by the training path (as ``torch.testing`` is not): :func:`cpu_trainer`
(:mod:`~lightning_fastdata.testing.trainer`), :mod:`~lightning_fastdata.testing.s3_server` and
:mod:`~lightning_fastdata.testing.fault_proxy`.
"""

from lightning_fastdata.testing.trainer import cpu_trainer

__all__ = ["cpu_trainer"]
