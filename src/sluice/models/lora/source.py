"""Where an adapter's files come from: a local folder as it is, or `s3://bucket/prefix`
downloaded once into a local cache (any S3-compatible endpoint through boto3; credentials from
the usual AWS_* variables, the endpoint from the setting or AWS_ENDPOINT_URL).

Each load also yields a fingerprint of the files (size and modification time, or the objects'
ETags), which joins the adapter's prefix-cache namespace: an adapter folder rewritten in place
never reuses K/V computed with the old weights.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import AdapterError
from sluice.models.lora.adapter_folder import CONFIG_FILE, WEIGHTS_FILE

FILES = (CONFIG_FILE, WEIGHTS_FILE)


@dataclass(slots=True, frozen=True)
class AdapterFiles:
    folder: Path  # a local folder holding the adapter's files
    fingerprint: str


def adapter_files(source: str, s3_endpoint: str | None = None, cache_dir: Path | None = None) -> AdapterFiles:
    """The adapter named by `source` as local files; AdapterError saying why not."""
    if source.startswith("s3://"):
        return _from_s3(source, s3_endpoint, cache_dir or Path(tempfile.gettempdir()) / "sluice-adapters")
    if "://" in source:
        raise AdapterError(f"adapter path {source!r}: a local folder or s3://bucket/prefix is served, nothing else")
    folder = Path(source).expanduser()
    parts = []
    for name in FILES:
        try:
            st = (folder / name).stat()
        except OSError:
            continue  # read_adapter names the missing file
        parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    return AdapterFiles(folder, ",".join(parts))


def _from_s3(uri: str, endpoint: str | None, cache_dir: Path) -> AdapterFiles:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise AdapterError(f"adapter path {uri!r}: expected s3://bucket/prefix")
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise AdapterError("adapters in S3 need boto3 on the worker: pip install 'sluice[lora-s3]'") from None
    client = boto3.client("s3", endpoint_url=endpoint or None)
    folder = cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:24]
    folder.mkdir(parents=True, exist_ok=True)
    tags = []
    for name in FILES:
        key = f"{prefix.rstrip('/')}/{name}" if prefix else name
        try:
            etag = client.head_object(Bucket=bucket, Key=key)["ETag"]
            marker = folder / f".{name}.etag"
            if not (folder / name).exists() or not marker.exists() or marker.read_text() != etag:
                partial = folder / f".{name}.part"
                client.download_file(bucket, key, str(partial))
                partial.replace(folder / name)
                marker.write_text(etag)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            what = "no such object" if code in ("404", "NoSuchKey", "NotFound") else code or "refused"
            raise AdapterError(f"{uri}: cannot fetch {name} ({what})") from None
        except (BotoCoreError, OSError) as exc:
            raise AdapterError(f"{uri}: cannot fetch {name} ({type(exc).__name__}: {exc})") from None
        tags.append(f"{name}:{etag}")
    return AdapterFiles(folder, ",".join(tags))
