"""The calls into obstore an object storage makes on its request threads, and its errors as ``OSError``.

Used by :class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`; every error names the URL and never
a secret.
"""

from __future__ import annotations

from typing import Any

from lightning_fastdata.errors import StorageError
from lightning_fastdata.loading.storage.base import ObjectStat
from lightning_fastdata.loading.storage.bucket_index import object_version
from lightning_fastdata.loading.storage.object_store_helper import first_line
from lightning_fastdata.loading.storage.retry import RetriesExhausted

__all__ = ["as_os_error", "get_object", "list_prefix", "profile_credentials"]


def as_os_error(err: BaseException, url: str, credentials: str = "") -> OSError:
    """``err`` (obstore's) as the ``OSError`` a reader gets: missing, refused (naming ``credentials``), or failed."""
    from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

    retried = None
    if isinstance(err, RetriesExhausted):  # the last error of a call retried for its whole budget
        retried = err.seconds
        err = err.error
    text = str(err)
    if "NoSuchBucket" in text:
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        return FileNotFoundError(f"The bucket {bucket!r} of {url} does not exist (or this endpoint does not serve it).")
    if isinstance(err, (NotFoundError, FileNotFoundError)):
        return FileNotFoundError(f"{url} does not exist in the bucket.")
    # a refused list request comes back as a generic error with the status in its text
    refused = any(
        s in text for s in ("403 Forbidden", "401 Unauthorized", "SignatureDoesNotMatch", "InvalidAccessKeyId")
    )
    if refused or isinstance(err, (PermissionDeniedError, UnauthenticatedError)):
        used = f"; credentials used: {credentials}" if credentials else ""
        return PermissionError(
            f"Access to {url} was refused ({first_line(err)}{used}): check the credentials (AWS_ACCESS_KEY_ID / "
            "AWS_PROFILE, or storage_options) and the bucket's policy."
        )
    how = f"for {retried:.0f} s of retries (storage_options retry_timeout)" if retried is not None else "after retries"
    return StorageError(f"Reading {url} failed {how}: {first_line(err)}")


def get_object(store: Any, relpath: str) -> tuple[bytes, int]:
    """The object's bytes and version (one request; run on a request thread, the GIL released while it waits).

    The version is :func:`~lightning_fastdata.loading.storage.bucket_index.object_version` of the size and ETag the
    answer carries.
    """
    import obstore

    result = obstore.get(store, relpath)
    meta = result.meta
    data = bytes(result.bytes())
    return data, object_version(int(meta["size"]), str(meta.get("e_tag") or ""))


def list_prefix(store: Any, prefix: str) -> list[ObjectStat]:
    """Every object under ``prefix`` (pages of 1,000 keys, one after another)."""
    import obstore

    entries: list[ObjectStat] = []
    for chunk in obstore.list(store, prefix or None, chunk_size=1000):
        entries.extend(ObjectStat(int(m["size"]), str(m.get("e_tag") or ""), m["path"]) for m in chunk)
    return entries


def profile_credentials(profile: str) -> Any:
    """Obstore's credential provider for an AWS profile (through boto3).

    Raises:
        ModuleNotFoundError: If boto3 is not installed (with what to install or set instead).
    """
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"AWS_PROFILE={profile!r} is set: reading a profile needs boto3. Run `pip install boto3`, or set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY instead."
        ) from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))
