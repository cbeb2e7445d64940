"""Checkpoints in S3-compatible object storage (`checkpoint_store = "s3://bucket/prefix"`).

boto3 is the client, made and the URL read as the search tier's cold archive does (common/s3.py:
any S3-compatible endpoint through `s3_endpoint`, credentials from the usual AWS_* variables,
botocore's standard retries). DCP's storage hooks carry
it: the writer is sluice's verified file writer (checkpoint/verified.py: DCP's, hashing what it
writes) on a local staging folder that, in `write_data`, uploads each rank's files as they are
written (inside DCP's background thread when the save is asynchronous) and, in the coordinator's
`finish` — which DCP runs only after every rank's `write_data` returned — uploads the manifest of
checksums, then `.metadata` last. The reader downloads the manifest and `.metadata`, then only
the files its rank's read plan names, checks each against the manifest, and lets DCP read them.

Atomic without rename: `s3://bucket/prefix/step-00000050/` counts as a checkpoint only once its
`.metadata` object exists, and each object appears whole or not at all, so a crash mid-write
leaves a step without `.metadata`: never loaded, and deleted at the next start (rank 0). Keep-K
and clean-up delete `.metadata` first, so a half-deleted step never looks complete either.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from sluice.common.s3 import S3ClientUnavailable, S3Url, error_code, s3_client
from sluice.train.checkpoint.layout import MANIFEST, METADATA
from sluice.train.checkpoint.lease import LEASE, Holder, parse_holder
from sluice.train.checkpoint.manifest import data_files
from sluice.train.checkpoint.verified import VerifiedReader, VerifiedWriter, done
from sluice.train.errors import CheckpointDamaged, CheckpointError, CheckpointStoreError

_STEP = re.compile(r"step-(\d{8})")


def parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → ("bucket", "some/prefix") (no slashes at the ends)."""
    try:
        where = S3Url.parse(url)
    except ValueError:
        raise CheckpointError(f"checkpoint_store {url!r} is not an s3:// URL") from None
    return where.bucket, where.path


def make_client(endpoint: str):
    try:
        return s3_client(endpoint)
    except S3ClientUnavailable:
        raise CheckpointError("checkpoints in object storage need boto3: pip install 'sluice[train]'") from None


class S3Store:
    def __init__(self, url: str, endpoint: str = "", client=None):
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_url(url)
        self.client = client or make_client(endpoint)

    def describe(self) -> str:
        return self.url

    def _key(self, step: int, name: str = "") -> str:
        return "/".join(filter(None, (self.prefix, f"step-{step:08d}", name)))

    def _objects(self) -> dict[int, list[str]]:
        """Every object under the prefix, by the step folder it is in."""
        found: dict[int, list[str]] = {}
        root = f"{self.prefix}/" if self.prefix else ""
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root):
            for obj in page.get("Contents", []):
                head = obj["Key"][len(root) :].split("/", 1)[0]
                if m := _STEP.fullmatch(head):
                    found.setdefault(int(m.group(1)), []).append(obj["Key"])
        return found

    def complete_steps(self) -> list[int]:
        return sorted(step for step, keys in self._objects().items() if self._key(step, METADATA) in keys)

    def incomplete_steps(self) -> list[int]:
        return []  # a step without .metadata is half-written: deleted at start-up (prepare)

    def step_name(self, step: int) -> str:
        return f"{self.url}/step-{step:08d}"

    def delete_step(self, step: int, keys: list[str] | None = None) -> None:
        try:
            keys = self._objects().get(step, []) if keys is None else keys
            marker = self._key(step, METADATA)
            if marker in keys:  # first: from here on the step is no longer complete
                self.client.delete_object(Bucket=self.bucket, Key=marker)
            rest = [k for k in keys if k != marker]
            for i in range(0, len(rest), 1000):
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in rest[i : i + 1000]]}
                )
        except Exception as exc:  # run in DCP's planning on the coordinator: gathered with pickle
            raise self._failed("deleting", self._key(step) + "/", exc) from exc

    def prepare(self, keep: int) -> None:
        try:
            objects = self._objects()
        except Exception as exc:  # botocore's errors: no bucket, no credentials, no endpoint
            raise CheckpointError(f"cannot list {self.url}: {exc}") from None
        for step, keys in objects.items():
            if self._key(step, METADATA) not in keys:
                self.delete_step(step, keys)  # half-written by a crash
        self._prune(keep)

    def _prune(self, keep: int) -> None:
        for step in self.complete_steps()[:-keep]:
            self.delete_step(step)

    def writer(self, step: int) -> S3Writer:
        return S3Writer(self, step)

    def publish(self, step: int, keep: int) -> str:
        self._prune(keep)
        return self._key(step)

    def reader(self, step: int) -> S3Reader:
        return S3Reader(self, step)

    def lease_records(self) -> S3LeaseRecords:
        return S3LeaseRecords(self)

    def upload(self, local: Path, step: int, name: str) -> None:
        key = self._key(step, name)
        try:
            self.client.upload_file(str(local), self.bucket, key)
        except Exception as exc:  # botocore's, unpicklable: DCP could not gather it
            raise self._failed("uploading", key, exc) from exc

    def download(self, step: int, name: str, local: Path) -> None:
        key = self._key(step, name)
        try:
            self.client.download_file(self.bucket, key, str(local))
        except Exception as exc:
            if error_code(exc) in ("404", "NoSuchKey"):
                raise CheckpointDamaged(self.step_name(step), f"{name} is missing") from None
            raise self._failed("downloading", key, exc) from exc

    def _failed(self, action: str, key: str, exc: Exception) -> CheckpointStoreError:
        return CheckpointStoreError(self.url, key, action, f"{type(exc).__name__}: {exc}")


class S3LeaseRecords:
    """The run's lease record (checkpoint/lease.py) as an object beside the steps, swapped with
    S3's conditional writes: If-None-Match: * to create, If-Match: ETAG to replace."""

    def __init__(self, store: S3Store):
        self.store = store
        self.key = "/".join(filter(None, (store.prefix, LEASE)))

    def where(self) -> str:
        return f"{self.store.url}/{LEASE}"

    def read(self) -> tuple[Holder | None, Any]:
        try:
            found = self.store.client.get_object(Bucket=self.store.bucket, Key=self.key)
        except Exception as exc:
            if error_code(exc) in ("404", "NoSuchKey"):
                return None, None
            raise self.store._failed("reading", self.key, exc) from exc
        return parse_holder(found["Body"].read()), found["ETag"]

    def write(self, holder: Holder | None, expected: Any) -> bool:
        condition = {"IfMatch": expected} if expected is not None else {"IfNoneMatch": "*"}
        body = holder.to_json() if holder is not None else b'{"released": true}'
        try:
            self.store.client.put_object(Bucket=self.store.bucket, Key=self.key, Body=body, **condition)
        except Exception as exc:
            if error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise self.store._failed("writing", self.key, exc) from exc
        return True


class S3Writer(VerifiedWriter):
    """The verified file writer on a staging folder, uploading each file once written, the
    manifest next, `.metadata` last."""

    def __init__(self, store: S3Store, step: int):
        self.store, self.step = store, step
        self.staging = Path(tempfile.mkdtemp(prefix=f"sluice-ckpt-{step}-"))
        super().__init__(self.staging, sync_files=False)  # the upload, not the staging copy, must last

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        # the coordinator, before any rank writes: a leftover of this step (an earlier attempt)
        # must not mix with the new files
        self.store.delete_step(self.step)
        return super().prepare_global_plan(plans)

    def write_data(self, plan, planner) -> Future[list[WriteResult]]:
        results = super().write_data(plan, planner).wait()
        try:
            for name in data_files(results):
                self.store.upload(self.staging / name, self.step, name)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)
        return done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        try:
            super().finish(metadata, results)  # .metadata, then manifest.json, in the staging folder
            self.store.upload(self.staging / MANIFEST, self.step, MANIFEST)
            self.store.upload(self.staging / METADATA, self.step, METADATA)  # the step is complete from here
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)


class S3Reader(VerifiedReader):
    """The verified file reader on a local cache of the files this rank's read plan needs."""

    def __init__(self, store: S3Store, step: int):
        self.store, self.step = store, step
        self.cache = Path(tempfile.mkdtemp(prefix=f"sluice-ckpt-{step}-"))
        super().__init__(self.cache, store.step_name(step))

    def fetch(self, name: str) -> None:
        if not (self.cache / name).exists():
            self.store.download(self.step, name, self.cache / name)

    def close(self) -> None:
        shutil.rmtree(self.cache, ignore_errors=True)

    def read_data(self, plan, planner) -> Future[None]:
        try:
            return super().read_data(plan, planner)
        finally:
            self.close()
