"""``open_storage``: the :class:`~lightning_fastdata.loading.storage.Storage` of a root, local or in a bucket."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.object_store import ObjectStorage
from lightning_fastdata.loading.storage import LocalStorage, Storage, is_url

__all__ = ["open_storage"]


def open_storage(root: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The :class:`~lightning_fastdata.loading.storage.Storage` of ``root``.

    An object store for a URL, the local file system otherwise.

    Args:
        root: A local folder, or a URL such as ``s3://bucket/prefix``.
        storage_options: Object-store settings (credentials, endpoint, timeouts; see
            :class:`~lightning_fastdata.loading.object_store.ObjectStorage`); not allowed with a local root.

    Raises:
        ValueError: If ``storage_options`` is given with a local root, or names an unknown setting.
        ModuleNotFoundError: If a URL is given and ``obstore`` is not installed.
    """
    if is_url(root):
        return ObjectStorage(root, storage_options)
    if storage_options:
        raise InvalidValueError(
            f"storage_options={dict(storage_options)!r} is for object-store roots (s3://, gs://, az://), but "
            f"{root!r} is a local path; remove storage_options or pass a URL."
        )
    return LocalStorage(root)
