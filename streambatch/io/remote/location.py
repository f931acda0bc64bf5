"""Where a remote store lives: its scheme, bucket and prefix, and the options its client is built with.

Credentials and endpoints come from the standard environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for S3-compatible
servers; ``GOOGLE_APPLICATION_CREDENTIALS`` (application default credentials:
a service account's key or gcloud's user login), ``GOOGLE_SERVICE_ACCOUNT`` (a
service account's key file), ``GOOGLE_BASE_URL`` (a GCS emulator) for GCS)
and from explicit *options*, which win.  No message or repr ever shows a secret.

>>> where = Location.parse("s3://bucket/data/web")
>>> where.url, where.key("header.json"), where.child("../code").url
('s3://bucket/data/web', 'data/web/header.json', 's3://bucket/data/code')
>>> is_remote("s3://b/x"), is_remote("/tmp/x"), is_remote("https://host/x")
(True, False, True)
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError, StoreError

SCHEMES = ("s3", "gs", "https", "http")
_SECRET = ("secret", "token", "password", "key", "credential", "service_account")
_S3_ENV = {
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "endpoint": "AWS_ENDPOINT_URL",
}


_QUERY = re.compile(r"(?i)\b((?:s3|gs|https?)://[^\s?#'\"]*)\?[^\s#'\":;,)]*")
_PARAMETER = re.compile(
    r"(?i)\b([\w.-]*(?:signature|credential|token|secret|password|passwd|sig|auth|key|session)[\w.-]*)=([^&\s'\";,)]+)"
)


def redact(text: str) -> str:
    """*text* as it may be shown: the query string of every address and every credential-like ``name=value``
    replaced (a presigned URL's signature, a token in a message).

    >>> redact("GET https://h/b/tokens.bin?X-Amz-Signature=abc&X-Amz-Date=1 failed; sig=xyz")
    'GET https://h/b/tokens.bin?<redacted> failed; sig=***'
    """
    return _PARAMETER.sub(r"\1=***", _QUERY.sub(r"\1?<redacted>", text))


def is_remote(path: object) -> bool:
    """Whether *path* names a store in object storage (``s3://``, ``gs://``, ``http(s)://``)."""
    return isinstance(path, str) and path.partition("://")[0].lower() in SCHEMES and "://" in path


def is_secret(name: str) -> bool:
    """Whether an option called *name* holds a secret (never shown).

    >>> is_secret("secret_access_key"), is_secret("region")
    (True, False)
    """
    lowered = name.lower()
    return any(part in lowered for part in _SECRET) and lowered not in ("access_key_id",)


@dataclass(frozen=True)
class Location:
    """A store's address: scheme, bucket (or host) and prefix; ``options`` (secrets hidden in its repr)."""

    scheme: str
    bucket: str
    prefix: str
    options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, url: str, options: Mapping[str, Any] | None = None) -> Location:
        """Parse ``SCHEME://BUCKET/PREFIX``; a URL with a user or password in it is refused (use options)."""
        scheme, _, rest = url.partition("://")
        scheme = scheme.lower()
        if scheme not in SCHEMES:
            raise ConfigError(f"{url!r} is not an s3://, gs:// or https:// address; pass one of those or a local path")
        bucket, _, prefix = rest.partition("/")
        if "@" in bucket:
            raise ConfigError(
                f"{scheme}://...@{bucket.rpartition('@')[2]}: credentials in an address are refused; "
                "pass them in the environment or as options"
            )
        if not bucket:
            raise ConfigError(f"{url!r} names no bucket or host; pass {scheme}://BUCKET/PREFIX")
        return cls(scheme, bucket, posixpath.normpath(prefix).strip("/") if prefix.strip("/") else "", dict(options or {}))

    @property
    def url(self) -> str:
        """The address as given (normalised, never with credentials; a query string is shown redacted)."""
        return redact(f"{self.scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}://{self.bucket}")

    @property
    def writable(self) -> bool:
        """Whether stores may be written here (``https://`` is read-only)."""
        return self.scheme in ("s3", "gs")

    def key(self, name: str) -> str:
        """The object key of file *name* of the store."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, relative: str) -> Location:
        """The location *relative* (a manifest's shard path, ``..`` allowed inside the bucket) from this one."""
        joined = posixpath.normpath(posixpath.join("/" + self.prefix, relative))
        return Location(self.scheme, self.bucket, joined.strip("/"), self.options)

    def parent(self) -> Location:
        """The folder holding this object (a manifest's folder)."""
        return Location(self.scheme, self.bucket, posixpath.dirname(self.prefix), self.options)

    def __str__(self) -> str:
        return self.url


def client_config(where: Location) -> dict[str, Any]:
    """The object-store client's configuration for *where*: the environment's, then the explicit options.

    Refuses (one line, `StoreError`) an S3 or GCS location without credentials: the client would otherwise
    ask a cloud metadata service.  ``skip_signature=True`` reads public buckets.
    """
    config: dict[str, Any] = {}
    options = dict(where.options)
    if where.scheme == "s3":
        for name, variable in _S3_ENV.items():
            if os.environ.get(variable):
                config[name] = os.environ[variable]
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        config["region"] = region or "us-east-1"
    elif where.scheme == "gs":
        if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):  # any kind gcloud writes, not only service accounts
            config["application_credentials"] = os.environ["GOOGLE_APPLICATION_CREDENTIALS"]
        for variable in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH"):
            if os.environ.get(variable):
                config["service_account_path"] = os.environ[variable]
        if os.environ.get("GOOGLE_SERVICE_ACCOUNT_KEY"):
            config["service_account_key"] = os.environ["GOOGLE_SERVICE_ACCOUNT_KEY"]
        if os.environ.get("GOOGLE_BASE_URL"):  # a GCS emulator (its http:// address allows plain HTTP)
            config["base_url"] = os.environ["GOOGLE_BASE_URL"]
    config.update(options)
    signed = not config.get("skip_signature")
    if where.scheme == "s3" and signed and not (config.get("access_key_id") and config.get("secret_access_key")):
        raise StoreError(
            f"{where.url}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, pass them as options, "
            "or pass skip_signature=True for a public bucket)"
        )
    if where.scheme == "gs" and signed and not any(k.startswith(("service_account", "application_credentials")) for k in config):
        raise StoreError(
            f"{where.url}: no credentials (set GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT, "
            "pass service_account_path, or pass skip_signature=True for a public bucket)"
        )
    return config


def shown(config: Mapping[str, Any]) -> dict[str, Any]:
    """*config* as it may be shown: every secret replaced by ``'***'``.

    >>> shown({"region": "eu", "secret_access_key": "x"})
    {'region': 'eu', 'secret_access_key': '***'}
    """
    return {k: "***" if is_secret(k) else v for k, v in config.items()}
