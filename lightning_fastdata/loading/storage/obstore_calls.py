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

__all__ = ["ENV_CONFIG", "as_os_error", "config_from_env", "get_object", "list_prefix", "profile_credentials"]


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


def get_object_range(store: Any, relpath: str, start: int, end: int) -> tuple[bytes, int]:
    """Bytes ``[start, end)`` of the object and its version (one ranged request, as :func:`get_object`).

    The version is of the object's whole size (the answer's ``Content-Range``) and ETag.
    """
    import obstore

    result = obstore.get(store, relpath, options={"range": (start, end)})
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


#: The environment variables obstore's stores read (their documented names, ``obstore/_store/*.pyi``) and the
#: configuration key each one sets, per URL scheme. The bucket's name comes from the URL and is left out. Checked
#: against obstore's stubs by ``tests/loading/test_object_store.py``.
ENV_CONFIG: dict[str, dict[str, str]] = {
    "s3": {
        "AWS_ACCESS_KEY_ID": "access_key_id",
        "AWS_SECRET_ACCESS_KEY": "secret_access_key",
        "AWS_SESSION_TOKEN": "session_token",
        "AWS_TOKEN": "session_token",
        "AWS_REGION": "region",
        "AWS_DEFAULT_REGION": "default_region",
        "AWS_ENDPOINT": "endpoint",
        "AWS_ENDPOINT_URL": "endpoint",
        "AWS_ENDPOINT_URL_S3": "aws_endpoint_url_s3",
        "AWS_CHECKSUM_ALGORITHM": "checksum_algorithm",
        "AWS_CONDITIONAL_PUT": "conditional_put",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "container_credentials_relative_uri",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "container_credentials_full_uri",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "container_authorization_token_file",
        "AWS_COPY_IF_NOT_EXISTS": "copy_if_not_exists",
        "AWS_DISABLE_TAGGING": "disable_tagging",
        "AWS_DISABLE_BULK_DELETE": "disable_bulk_delete",
        "AWS_IMDSV1_FALLBACK": "imdsv1_fallback",
        "AWS_METADATA_ENDPOINT": "metadata_endpoint",
        "AWS_REQUEST_PAYER": "request_payer",
        "AWS_ROLE_ARN": "role_arn",
        "AWS_ROLE_SESSION_NAME": "role_session_name",
        "AWS_S3_EXPRESS": "s3_express",
        "AWS_SERVER_SIDE_ENCRYPTION": "server_side_encryption",
        "AWS_SKIP_SIGNATURE": "skip_signature",
        "AWS_SSE_BUCKET_KEY_ENABLED": "sse_bucket_key_enabled",
        "AWS_SSE_CUSTOMER_KEY_BASE64": "sse_customer_key_base64",
        "AWS_SSE_KMS_KEY_ID": "sse_kms_key_id",
        "AWS_STS_ENDPOINT": "sts_endpoint",
        "AWS_UNSIGNED_PAYLOAD": "unsigned_payload",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "virtual_hosted_style_request",
        "AWS_WEB_IDENTITY_TOKEN_FILE": "web_identity_token_file",
    },
    "gs": {
        "GOOGLE_SERVICE_ACCOUNT": "service_account",
        "GOOGLE_SERVICE_ACCOUNT_PATH": "service_account",
        "GOOGLE_SERVICE_ACCOUNT_KEY": "service_account_key",
        "GOOGLE_BASE_URL": "base_url",
        "GOOGLE_BEARER_TOKEN": "bearer_token",
        "GOOGLE_APPLICATION_CREDENTIALS": "application_credentials",
        "GOOGLE_SKIP_SIGNATURE": "skip_signature",
    },
    "az": {
        "AZURE_STORAGE_ACCOUNT_NAME": "account_name",
        "AZURE_STORAGE_ACCOUNT_KEY": "account_key",
        "AZURE_STORAGE_ACCESS_KEY": "account_key",
        "AZURE_STORAGE_MASTER_KEY": "account_key",
        "AZURE_STORAGE_CLIENT_ID": "client_id",
        "AZURE_CLIENT_ID": "client_id",
        "AZURE_STORAGE_CLIENT_SECRET": "client_secret",
        "AZURE_CLIENT_SECRET": "client_secret",
        "AZURE_CREDENTIAL_TYPE": "credential_type",
        "AZURE_STORAGE_TENANT_ID": "tenant_id",
        "AZURE_STORAGE_AUTHORITY_ID": "tenant_id",
        "AZURE_TENANT_ID": "tenant_id",
        "AZURE_AUTHORITY_ID": "tenant_id",
        "AZURE_STORAGE_AUTHORITY_HOST": "authority_host",
        "AZURE_AUTHORITY_HOST": "authority_host",
        "AZURE_STORAGE_SAS_KEY": "sas_key",
        "AZURE_STORAGE_SAS_TOKEN": "sas_key",
        "AZURE_STORAGE_TOKEN": "token",
        "AZURE_STORAGE_USE_EMULATOR": "use_emulator",
        "AZURE_ENCRYPTION_KEY": "encryption_key",
        "AZURE_STORAGE_ENDPOINT": "endpoint",
        "AZURE_ENDPOINT": "endpoint",
        "AZURE_MSI_ENDPOINT": "msi_endpoint",
        "AZURE_IDENTITY_ENDPOINT": "msi_endpoint",
        "AZURE_OBJECT_ID": "object_id",
        "AZURE_MSI_RESOURCE_ID": "msi_resource_id",
        "AZURE_FEDERATED_TOKEN_FILE": "federated_token_file",
        "AZURE_USE_AZURE_CLI": "use_azure_cli",
        "AZURE_SKIP_SIGNATURE": "skip_signature",
        "AZURE_DISABLE_TAGGING": "disable_tagging",
        "AZURE_FABRIC_TOKEN_SERVICE_URL": "fabric_token_service_url",
        "AZURE_FABRIC_WORKLOAD_HOST": "fabric_workload_host",
        "AZURE_FABRIC_SESSION_TOKEN": "fabric_session_token",
        "AZURE_FABRIC_CLUSTER_IDENTIFIER": "fabric_cluster_identifier",
    },
}
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "adl": "az", "azure": "az", "abfs": "az", "abfss": "az"}
_ALIAS_PREFIXES = ("aws_", "google_", "azure_storage_", "azure_")


def config_from_env(url: str, env: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """The obstore configuration for ``url`` from the environment ``env`` (the variables above).

    Less the keys ``options`` sets under any of their names (``region`` or ``aws_region``); credentials in
    ``options`` drop the environment's (one pair, never a mix).

    Passed to the store in every reading process, so each reads with the environment of the process that made the
    storage (the helper process may have started before a variable was set); obstore's own reading of the
    process environment stays under it (a variable removed after the helper started is still seen there).
    """
    table = ENV_CONFIG.get(_SCHEMES.get(url.split("://", 1)[0].lower(), ""), {})
    given = set()
    for key in options:
        name = key.lower()
        given.add(name)
        given.update(name[len(p) :] for p in _ALIAS_PREFIXES if name.startswith(p))
    secrets = {"access_key_id", "secret_access_key", "session_token", "account_key", "client_secret", "sas_key"}
    config: dict[str, Any] = {}
    for var, key in table.items():
        if var in env and key not in given and key not in config and not (key in secrets and given & secrets):
            config[key] = env[var]
    return config
