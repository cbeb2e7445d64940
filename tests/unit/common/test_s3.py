"""s3:// URLs and the S3 client, one way for the search tier's archives and training's checkpoints
(common/s3.py); each keeps its own rule on top (an archive is one object; a checkpoint store a prefix)."""

from __future__ import annotations

import pickle

import pytest

from sluice.common.s3 import S3Url, error_code, s3_client
from sluice.search.tiers.archive import S3Location
from sluice.train.checkpoint.object_store import S3Store, parse_url
from sluice.train.errors import CheckpointError, CheckpointStoreError


def test_a_url_is_a_bucket_and_a_path():
    assert S3Url.parse("s3://b/runs/r1/") == S3Url("b", "runs/r1")
    assert S3Url.parse("s3://b") == S3Url("b", "") and str(S3Url("b", "")) == "s3://b"
    assert S3Url("b", "runs").key("step-1", ".metadata") == "runs/step-1/.metadata"
    for bad in ("b/key", "gs://b/key", "s3://", "s3:///key"):
        with pytest.raises(ValueError, match="not an s3://"):
            S3Url.parse(bad)


def test_each_system_keeps_its_own_rule():
    assert str(S3Location.parse("s3://bucket/a/b.tar.gz")) == "s3://bucket/a/b.tar.gz"
    for not_one_object in ("s3://bucket", "s3://bucket/", "s3://bucket/dir/", "http://bucket/k"):
        with pytest.raises(ValueError, match="an archive location is s3://BUCKET/KEY"):
            S3Location.parse(not_one_object)
    assert parse_url("s3://ckpt/runs/r1/") == ("ckpt", "runs/r1") and parse_url("s3://ckpt") == ("ckpt", "")
    with pytest.raises(CheckpointError, match="is not an s3:// URL"):
        parse_url("/local/folder")


def test_the_client_takes_endpoint_region_and_retries_from_the_environment(monkeypatch):
    pytest.importorskip("boto3")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    client = s3_client("http://127.0.0.1:9")
    assert client.meta.endpoint_url == "http://127.0.0.1:9" and client.meta.region_name == "us-east-1"
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 3}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    client = s3_client("")
    assert client.meta.region_name == "eu-west-1" and client.meta.config.retries["total_max_attempts"] == 7
    assert "amazonaws.com" in client.meta.endpoint_url  # "" is AWS itself


def test_a_failed_store_call_stays_one_picklable_error():
    """Issue 40 item 15: DCP gathers a rank's exception with pickle; the shared client must not
    change that (botocore's own errors hold what pickle cannot carry)."""
    pytest.importorskip("boto3")
    from botocore.exceptions import ClientError

    cause = ClientError({"Error": {"Code": "NoSuchBucket", "Message": "gone"}}, "PutObject")
    assert error_code(cause) == "NoSuchBucket" and error_code(ValueError("x")) is None
    store = S3Store("s3://ckpt/runs/r1", client=object())
    err = pickle.loads(pickle.dumps(store._failed("uploading", "runs/r1/step-00000002/x.distcp", cause)))
    assert isinstance(err, CheckpointStoreError) and "s3://ckpt/runs/r1" in str(err) and "NoSuchBucket" in str(err)
