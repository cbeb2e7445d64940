"""Checkpoints in S3-compatible object storage, against a real server (moto's server mode): a
step whose upload is cut short never counts as a checkpoint and is cleaned up at the next start,
only the newest K are kept, and a run resumes from the bucket (its local folder holds none) to the
very losses of the uninterrupted run; export reads the bucket too."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from sluice.train.checkpoint.object_store import S3Store
from tests.s3_server import AWS_ENV, moto_server
from tests.system.train.conftest import COMMON, STEPS, losses, run_in_process


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def aws(monkeypatch):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)


def _bucket(s3: str, name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket=name)


def test_a_cut_upload_never_looks_complete_and_only_k_are_kept(s3, aws, monkeypatch):
    _bucket(s3, "atomic")
    store = S3Store("s3://atomic/runs/a", s3)
    state = {"w": torch.arange(6.0), "step": torch.tensor(0)}
    for step in (1, 2, 3):
        state["w"] += 1
        dcp.save(state, storage_writer=store.writer(step), no_dist=True)
        store.publish(step, keep=2)
    assert store.complete_steps() == [2, 3]
    # a crash while step 4 uploads: its data files are in the bucket, its .metadata never comes
    real = store.upload

    def crash_on_metadata(local, step, name):
        if name == ".metadata":
            raise ConnectionError("the writer died here")
        real(local, step, name)

    monkeypatch.setattr(store, "upload", crash_on_metadata)
    with pytest.raises(BaseException, match="the writer died here"):  # DCP wraps it in a BaseException
        dcp.save({"w": state["w"] + 1, "step": state["step"]}, storage_writer=store.writer(4), no_dist=True)
    monkeypatch.setattr(store, "upload", real)
    assert 4 in store._objects() and store.complete_steps() == [2, 3]
    store.prepare(keep=2)  # the next start
    assert sorted(store._objects()) == [2, 3]
    loaded = {"w": torch.zeros(6), "step": torch.tensor(-1)}
    dcp.load(loaded, storage_reader=store.reader(3), no_dist=True)
    assert torch.equal(loaded["w"], torch.arange(6.0) + 3)


def test_a_run_resumes_from_the_bucket_exactly(s3, aws, train_dir, tiny_folder, chat_data, one_run):
    _bucket(s3, "ckpt")
    out = train_dir / "s3-run"
    args = [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        *COMMON,
        "--nproc",
        "1",
        "--checkpoint-store",
        "s3://ckpt/runs/r1",
        "--s3-endpoint",
        s3,
        "--checkpoint-every",
        "2",
    ]
    first = list(args)
    first[first.index("--max-steps") + 1] = "5"
    run_in_process(*first)
    store = S3Store("s3://ckpt/runs/r1", s3)
    assert store.complete_steps() == [4, 5]  # keep 2
    assert not any((out / "checkpoints").glob("step-*")), "nothing local: the bucket holds them"
    run_in_process(*args)  # resumes at step 5, from the bucket
    assert losses(out) == losses(one_run)  # bit for bit: same world size, rows, optimizer state
    assert store.complete_steps() == [6, STEPS]

    from sluice.train.export import export_run

    step, folder, _ = export_run(out, train_dir / "s3-export")
    assert step == STEPS and (folder / "config.json").exists()


def test_a_damaged_checkpoint_in_the_bucket_is_named_and_skipped(
    s3, aws, train_dir, tiny_folder, chat_data, one_run, capfd
):
    import boto3

    _bucket(s3, "damaged")
    out = train_dir / "s3-damaged"
    url = "s3://damaged/runs/r1"
    args = [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        *COMMON,
        "--nproc",
        "1",
        "--checkpoint-store",
        url,
        "--s3-endpoint",
        s3,
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "3",
    ]
    run_in_process(*args, "--max-steps", "5")
    assert S3Store(url, s3).complete_steps() == [2, 4, 5]
    # 64 KiB of other bytes in the middle of step 5's data object, its size unchanged
    client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
    key = "runs/r1/step-00000005/__0_0.distcp"
    body = bytearray(client.get_object(Bucket="damaged", Key=key)["Body"].read())
    middle = len(body) // 2
    body[middle : middle + 65536] = bytes(b ^ 0xFF for b in body[middle : middle + 65536])
    client.put_object(Bucket="damaged", Key=key, Body=bytes(body))
    capfd.readouterr()
    run_in_process(*args)
    err = capfd.readouterr().err
    named = [line for line in err.splitlines() if f"{url}/step-00000005" in line]
    assert len(named) == 1 and "__0_0.distcp differs from its sha256" in named[0], err[-3000:]
    assert "resumed from step 4" in err and "Traceback" not in err
    assert losses(out) == losses(one_run)


def test_the_runs_lease_lives_in_the_bucket_behind_conditional_writes(s3, aws) -> None:
    from dataclasses import replace

    from sluice.train.checkpoint.lease import Holder, Lease, this_process
    from sluice.train.errors import TrainHaltError

    _bucket(s3, "leases")
    records = S3Store("s3://leases/runs/a", s3).lease_records()
    assert records.read() == (None, None)
    me = this_process()
    assert records.write(me, None)
    assert not records.write(me, None), "If-None-Match: *: a second creation loses"
    holder, version = records.read()
    assert holder == me
    assert records.write(replace(me, beat=1), version)
    assert not records.write(replace(me, beat=2), version), "If-Match: a write from a stale read loses"
    records.write(None, records.read()[1])  # released
    assert records.read()[0] is None

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] % 10 < 1.0:
            first.renew()  # the first group's heartbeat, every third of the timeout

    first = Lease(records, 30, me=Holder("node-a", 1, None, "token-a"), clock=lambda: now[0], sleep=sleep)
    first.acquire(print)
    with pytest.raises(
        TrainHaltError, match=r"s3://leases/runs/a/lease.json is held by another group \(its leader: host node-a"
    ):
        Lease(records, 30, clock=lambda: now[0], sleep=sleep).acquire(print)
    said: list[str] = []
    Lease(records, 30, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)).acquire(said.append)
    assert "not renewed for 30 s" in said[0] and not first.held()


def test_a_cut_upload_names_the_store_the_object_and_the_cause(s3, aws, train_dir, tiny_folder, chat_data, one_run):
    """The store goes away as the first checkpoint's first data object is uploaded (a proxy in
    front of moto cuts every connection from there): each rank's first error is one line naming
    the store, the object and what failed (it was `TypeError: cannot pickle '_io.BufferedReader'`,
    raised while DCP gathered botocore's exception); no step is complete; once the store is back,
    the run starts over cleanly."""
    import subprocess
    from urllib.parse import urlparse

    from tests.cut_proxy import CutProxy
    from tests.system.train.conftest import RUN_TIMEOUT_S, train_cmd

    _bucket(s3, "cut")
    proxy = CutProxy(urlparse(s3).port, cut_at=b".distcp")
    out = train_dir / "s3-cut"
    url = "s3://cut/runs/r1"
    args = [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        *COMMON,
        "--checkpoint-store",
        url,
        "--s3-endpoint",
        proxy.url,
        "--checkpoint-every",
        "2",
    ]
    try:
        proc = subprocess.run(
            train_cmd("run", *args, "--nproc", "2", "--max-restarts", "0"),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert proc.returncode == 1 and proxy.cut.is_set(), proc.stderr[-3000:]
        for rank in (0, 1):
            first = next(line for line in proc.stderr.splitlines() if line.startswith(f"[rank {rank}] sluice: error:"))
            assert f"checkpoint store {url}: uploading runs/r1/step-00000002/__{rank}_0.distcp failed: " in first, first
            assert "ConnectionClosedError" in first or "EndpointConnectionError" in first, first
        assert "cannot pickle" not in proc.stderr and "CheckpointException" not in proc.stderr
        proxy.restore()  # the store is back
        assert S3Store(url, s3).complete_steps() == []
        run_in_process(*args, "--nproc", "1")
    finally:
        proxy.close()
    assert losses(out) == losses(one_run)
    assert S3Store(url, s3).complete_steps() == [6, STEPS]
