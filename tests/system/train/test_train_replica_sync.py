"""LocalSGD across replica groups (`--replica-sync local_sgd --sync-every 4`): between syncs each
group trains on its own share of every global batch and only the step's small vector crosses
(loss and groups present); at every 4th step the parameters are averaged, so both groups end with
the same weights bit for bit (sha256 per rank); the bytes show it."""

from __future__ import annotations

import json

import pytest

from tests.system.train.conftest import COMMON, STEPS, losses, run_train

pytest.importorskip("torchft")


def test_local_sgd_sends_the_parameters_every_sync_every_steps_only(train_dir, tiny_folder, chat_data):
    out = train_dir / "local-sgd"
    run_train(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--replica-groups",
        "2",
        "--replica-sync",
        "local_sgd",
        "--sync-every",
        "4",
        *COMMON,
    )
    assert len(losses(out)) == STEPS
    sent = [json.loads(x)["comm_bytes"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    small = 8 * 3  # the step's vector: a float64 loss sum and one slot per group
    params = sent[3] - small
    assert params > 100 * small
    assert sent == [small, small, small, small + params] * 2
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    end = {e["group"]: e["sha256"] for e in events if e["event"] == "digest" and e.get("end")}
    assert len(end) == 2 and end[0] == end[1]  # step 8 synced: the same weights in both groups
