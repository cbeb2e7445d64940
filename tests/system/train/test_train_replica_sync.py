"""LocalSGD across replica groups (`--replica-sync local_sgd --sync-every 4`, torchft's LocalSGD):
between syncs each group trains on its own share of every global batch and nothing crosses; at
every 4th step torchft takes the quorum and averages the parameters, so both groups end with the
same weights bit for bit (sha256 per rank); the bytes show it."""

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
    params = sent[3]  # the parameters, at the sync step only
    assert params > 10_000
    assert sent == [0, 0, 0, params] * 2
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    end = {e["group"]: e["sha256"] for e in events if e["event"] == "digest" and e.get("end")}
    assert len(end) == 2 and end[0] == end[1]  # step 8 synced: the same weights in both groups


def test_a_killed_group_heals_from_its_peer_at_a_diloco_sync(train_dir, tiny_folder, chat_data):
    """torchft's quorum is taken at the syncs only (every 4 steps): group 1 dies at step 3 and
    group 0 waits at the start of step 8 for its restart. The restarted group restores the newest
    checkpoint and syncs at once: its quorum waits for group 0's next sync (the Lighthouse forms
    none with half the live groups or fewer): step 4's if it came back before group 0 got there,
    else 8's (or 12's, if group 0 asked first; group 0 synced alone at 4 once the Lighthouse
    stopped hearing group 1). There it takes group 0's state (parameters, AdamW, step, DiLoCo's
    backup and outer momentum) and both end with the same weights."""
    out = train_dir / "diloco-kill"
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
        "diloco",
        "--sync-every",
        "4",
        "--checkpoint-every",
        "4",
        "--max-restarts",
        "2",
        "--progress-interval",
        "0",
        *[a if a != str(STEPS) else "12" for a in COMMON],
        env={"SLUICE_TRAIN_FAULT": "kill:0:3:1,await_group:1:8"},
    )
    assert len(losses(out)) == 12  # group 0's lines: it never stopped
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    started = [(e["group"], e["restart"]) for e in events if e["event"] == "started"]
    assert sorted(started) == [(0, 0), (1, 0), (1, 1)]
    healed = [(e["group"], e["step"]) for e in events if e["event"] == "healed"]
    assert healed in ([(1, 4)], [(1, 8)], [(1, 12)])  # once, at group 0's first sync after group 1 asked
    end = {e["group"]: e["sha256"] for e in events if e["event"] == "digest" and e.get("end")}
    assert len(end) == 2 and end[0] == end[1]
