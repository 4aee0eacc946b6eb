"""Which backend serves a root: a registry of storage backends by URL scheme, and :func:`open_storage`.

A local path gets :class:`~lightning_fastdata.loading.storage.local.LocalStorage`; a URL gets the backend
registered for its scheme (``s3``, ``gs``, ``az``, ...:
:class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`). A new backend registers itself with
:func:`register_storage` and is then used everywhere a root
is accepted (DataModules, ``fastdata convert``, the cache build, the doctor), as LitData's downloader registry does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.storage.base import OBJECT_STORE_SCHEMES, Storage, add_url_scheme, url_scheme
from lightning_fastdata.loading.storage.local import LocalStorage
from lightning_fastdata.loading.storage.object_store import ObjectStorage

__all__ = ["StorageFactory", "open_storage", "register_storage"]

#: ``factory(root_url, storage_options)`` returns a backend.
StorageFactory = Callable[[str, Mapping[str, Any] | None], Storage]

_BACKENDS: dict[str, StorageFactory] = {}


def register_storage(schemes: Sequence[str], factory: StorageFactory) -> None:
    """Serve URLs of ``schemes`` (``["http", "https"]``) with ``factory(root, storage_options)``.

    Raises:
        ValueError: If a scheme is empty or has ``://`` in it.
    """
    for scheme in schemes:
        if not scheme or "://" in scheme:
            raise InvalidValueError(f"A storage scheme is a name such as 's3', got {scheme!r}.")
        _BACKENDS[scheme.lower()] = factory
        add_url_scheme(scheme)


register_storage(OBJECT_STORE_SCHEMES, ObjectStorage)


def open_storage(root: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The :class:`~lightning_fastdata.loading.storage.base.Storage` of ``root``.

    The backend registered for a URL's scheme, the local file system otherwise.

    Args:
        root: A local folder, or a URL such as ``s3://bucket/prefix``.
        storage_options: The backend's settings (for an object store: credentials, endpoint, timeouts; see
            :class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`); not allowed with a local root.

    Raises:
        ValueError: If ``storage_options`` is given with a local root, or names an unknown setting.
        ModuleNotFoundError: If a URL is given and its backend's client (``obstore``) is not installed.
    """
    scheme = url_scheme(root)
    if scheme is not None:
        return _BACKENDS[scheme](root, storage_options)
    if storage_options:
        raise InvalidValueError(
            f"storage_options={dict(storage_options)!r} is for object-store roots (s3://, gs://, az://), but "
            f"{root!r} is a local path; remove storage_options or pass a URL."
        )
    return LocalStorage(root)
