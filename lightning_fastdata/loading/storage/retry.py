"""Retries over an outage budget: what turns a server restart or a network blip into a pause instead of a failure.

obstore retries a failed request a few times within a second (``max_retries``); a server that restarts takes
seconds. :func:`retried` retries on top of that with exponential backoff and jitter until ``retry_timeout``
seconds have passed since the first attempt, for every error that may pass (refused or dropped connections,
timeouts, 5xx answers, throttling) and none that cannot (a missing object or bucket, a refused credential).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["BACKOFF", "RetriesExhausted", "permanent", "retried"]

T = TypeVar("T")

#: First wait and cap of our backoff between attempts, in seconds; obstore's own retries come before.
BACKOFF = (0.25, 5.0)


def permanent(err: BaseException) -> bool:
    """Whether retrying ``err`` cannot help.

    A missing object or bucket, a refused credential, a bad request; data that are not what they should be (a
    :class:`~lightning_fastdata.errors.DataError`, a file pyarrow cannot parse).
    """
    from lightning_fastdata.errors import DataError

    cause: BaseException | None = err
    while cause is not None:  # pyarrow raises what a file's read raised, or wraps it
        if isinstance(cause, DataError) or type(cause).__name__ in ("ArrowInvalid", "ArrowTypeError"):
            return True
        cause = cause.__cause__ or cause.__context__
    from obstore.exceptions import (
        AlreadyExistsError,
        InvalidPathError,
        NotFoundError,
        NotSupportedError,
        PermissionDeniedError,
        UnauthenticatedError,
        UnknownConfigurationKeyError,
    )

    kinds = (NotFoundError, PermissionDeniedError, UnauthenticatedError, InvalidPathError, NotSupportedError)
    if isinstance(err, (*kinds, AlreadyExistsError, UnknownConfigurationKeyError, FileNotFoundError, PermissionError)):
        return True
    text = str(err)
    return any(
        s in text
        for s in (
            "NoSuchBucket",
            "NoSuchKey",
            "403 Forbidden",
            "401 Unauthorized",
            "400 Bad Request",
            "416 Range Not Satisfiable",
            "SignatureDoesNotMatch",
            "InvalidAccessKeyId",
        )
    )


class RetriesExhausted(Exception):
    """A call that kept failing for a reason that may pass, for its whole retry budget.

    ``error``: its last error (also the ``__cause__``); ``seconds``: how long it was retried.
    """

    def __init__(self, error: BaseException, seconds: float) -> None:
        super().__init__(f"{error} (retried for {seconds:.1f} s)")
        self.error = error
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.error, self.seconds)  # crosses the helper process's pipe


def retried(budget: float, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, retried with exponential backoff and jitter while it fails for a reason that may pass.

    A permanent failure (:func:`permanent`) is raised as it is, at once.

    Raises:
        RetriesExhausted: Once the next attempt would start more than ``budget`` seconds after the first.
    """
    start = time.monotonic()
    delay = BACKOFF[0]
    while True:
        try:
            return fn(*args)
        except Exception as err:
            if permanent(err):
                raise
            elapsed = time.monotonic() - start
            if elapsed + delay > budget:
                raise RetriesExhausted(err, elapsed) from err
            time.sleep(delay * (0.5 + 0.5 * random.random()))
            delay = min(2 * delay, BACKOFF[1])
