"""The errors our validation raises on purpose: built-in types, marked so a command can print them as one line.

Each is a subclass of the built-in exception it stands for (``InvalidValueError`` is a ``ValueError``, and so on),
so ``except ValueError`` keeps working. Every one carries a message that names the argument, file or URL and
says what to do; the ``fastdata`` command prints such a message alone (``fastdata fit: error: ...``, exit
status 1) and shows the whole traceback for anything else, which is a bug to report.
"""

from __future__ import annotations

__all__ = [
    "CORRUPT_IMAGE_ADVICE",
    "AccessError",
    "CorruptImageError",
    "DataError",
    "InvalidTypeError",
    "InvalidValueError",
    "NotAFolderError",
    "PathExistsError",
    "PathNotFoundError",
    "StorageError",
    "UsageError",
]


class UsageError(Exception):
    """Marks an error raised on purpose by our validation; its message is the whole story (see the module)."""


class InvalidValueError(UsageError, ValueError):
    """An argument's value is impossible (named, with what is expected)."""


class InvalidTypeError(UsageError, TypeError):
    """An argument has the wrong type."""


class PathNotFoundError(UsageError, FileNotFoundError):
    """A file or folder the user named does not exist, or does not hold what it should."""


class PathExistsError(UsageError, FileExistsError):
    """A path we would write already exists and must not be replaced."""


class NotAFolderError(UsageError, NotADirectoryError):
    """A path that should be a folder is a file."""


class AccessError(UsageError, PermissionError):
    """The data (or a place to write) cannot be read or written by this user."""


class DataError(UsageError, OSError):
    """The data are unusable as they are: a corrupt or changed file, a full disk, a stale cache (named)."""


class CorruptImageError(DataError):
    """An image's bytes do not decode (corrupt, truncated, too large): what ``on_corrupt="skip"`` skips."""


#: The last sentence of the error of an image that does not decode, which advises ``on_corrupt='skip'``; left out
#: where that does not apply (the ``max_corrupt_fraction`` error, raised to a user who already skips).
CORRUPT_IMAGE_ADVICE = (
    " The file is corrupt, truncated or too large: replace or delete it, or pass on_corrupt='skip' to skip such files "
    "(each is logged and counted)."
)


class StorageError(UsageError, OSError):
    """The data could not be read (network, throttling, timeout, permission, a file gone), after the retries allowed.

    Not a corrupt file: ``on_corrupt="skip"`` never skips it, so an outage cannot turn into an epoch of no samples.
    """
