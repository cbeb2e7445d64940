"""S3-compatible object storage, as the search tier's archives and training's checkpoints use it:
one way to read an `s3://BUCKET/PATH` URL and one way to make the client.

The client is boto3's (an optional dependency: the `search-cold` and `train` extras install it),
aimed at any S3-compatible endpoint (`endpoint`, e.g. MinIO or moto; empty: AWS itself), with
credentials from boto3's usual chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an
instance role), the region from AWS_REGION or AWS_DEFAULT_REGION (us-east-1 when neither is set:
S3-compatible servers ignore it, and boto3 refuses to sign without one), and botocore's
"standard" retries (3 attempts with jittered back-off, for throttling and transient network
errors), unless AWS_RETRY_MODE / AWS_MAX_ATTEMPTS say otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

SCHEME = "s3://"


class S3ClientUnavailable(RuntimeError):
    """boto3 is not installed."""


@dataclass(frozen=True, slots=True)
class S3Url:
    """`s3://bucket/path`: the bucket, and the path inside it without slashes at its ends
    (an object's key, or a prefix; "" for the bucket's root)."""

    bucket: str
    path: str

    @classmethod
    def parse(cls, url: str) -> S3Url:
        """Raises ValueError when `url` is not s3://BUCKET[/PATH]."""
        bucket, _, path = url.removeprefix(SCHEME).partition("/")
        if not url.startswith(SCHEME) or not bucket:
            raise ValueError(f"{url!r} is not an s3://BUCKET/PATH URL")
        return cls(bucket, path.strip("/"))

    def key(self, *names: str) -> str:
        """The object key of `names` under this path."""
        return "/".join(filter(None, (self.path, *names)))

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.path}" if self.path else f"{SCHEME}{self.bucket}"


def s3_client(endpoint: str | None = None) -> Any:
    """A boto3 S3 client for `endpoint` (None or "": AWS). Raises S3ClientUnavailable without boto3."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise S3ClientUnavailable(
            "object storage needs boto3 (pip install 'sluice[train]' or 'sluice[search-cold]')"
        ) from None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    retries = {
        "mode": os.environ.get("AWS_RETRY_MODE") or "standard",
        "total_max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS") or 3),
    }
    return boto3.client("s3", endpoint_url=endpoint or None, region_name=region, config=Config(retries=retries))


def error_code(exc: BaseException) -> str | None:
    """An S3 error's code (botocore's ClientError: "NoSuchKey", "404", "PreconditionFailed"…), else None."""
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None
