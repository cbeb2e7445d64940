"""The errors a rank raises inside DCP travel to every rank with pickle (DCP gathers them): they
must come back whole, message and fields."""

from __future__ import annotations

import pickle

from sluice.train.errors import CheckpointDamaged, CheckpointStoreError


def test_checkpoint_errors_survive_pickle():
    store = CheckpointStoreError(
        "s3://b/runs/r1",
        "runs/r1/step-00000002/__1_0.distcp",
        "uploading",
        "ConnectionClosedError: Connection was closed",
    )
    damaged = CheckpointDamaged("runs/r1/checkpoints/step-00000002", "__0_0.distcp is missing")
    for exc in (store, damaged):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.__dict__ == exc.__dict__
    assert str(store) == (
        "checkpoint store s3://b/runs/r1: uploading runs/r1/step-00000002/__1_0.distcp failed: "
        "ConnectionClosedError: Connection was closed"
    )
