"""LoRA across replica groups (torchft): the groups exchange, heal and digest the adapter's
parameters only (the frozen base is the same model in every group, rebuilt from its folder).

2 groups of 1 rank; group 1 is killed (-9) at the start of step 3, restarts, heals from group 0
(the adapter and its AdamW state, no checkpoint read) and trains with it again (by step 6: a
restart of one process may rejoin sooner): its adapter equals group 0's bit for bit then and at
the end, every base stays the folder's, and with both groups present a step's loss is the global
batch's (one process's)."""

from __future__ import annotations

import json

import pytest

from tests.system.train.conftest import ADAPTER_PARAMS, COMMON, LORA, STEPS, base_sha256, events, losses, run_train

pytest.importorskip("torchft")


def test_a_killed_group_heals_its_adapter_from_a_live_peer(train_dir, tiny_folder, chat_data, lora_one):
    out = train_dir / "lora-replicas"
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
        "--checkpoint-every",
        "3",
        "--max-restarts",
        "2",
        *LORA,
        *COMMON,
        env={"SLUICE_TRAIN_FAULT": "kill:0:3:1,await_group:1:6"},
    )
    healed = events(out, "healed")
    assert len(healed) == 1 and healed[0]["group"] == 1 and 2 <= healed[0]["step"] <= 5, healed
    assert not events(out, "restored")
    digests = events(out, "digest")
    rejoined = healed[0]["step"] + 1  # the first step both groups trained again, from these weights
    for when in ([e for e in digests if e["step"] == rejoined], [e for e in digests if e.get("end")]):
        by_group = {e["group"]: e["sha256"] for e in when}
        assert len(by_group) == 2 and by_group[0] == by_group[1], when
    folder_sha = base_sha256(tiny_folder)
    ends = [e for e in events(out, "base") if e["at"] == "end"]
    assert sorted(e["group"] for e in ends) == [0, 1]
    assert all(e["unchanged"] and e["sha256"] == folder_sha for e in ends)
    got = losses(out)
    assert len(got) == STEPS
    # what crossed between the groups each step: the adapter's gradients (fp32) and the small
    # vector (the loss sum and a slot per group, float64), not the base's
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {m["comm_bytes"] for m in metrics if m["replica_groups"] == [0, 1]} == {4 * ADAPTER_PARAMS + 8 * 3}
    assert got[:2] == pytest.approx(losses(lora_one)[:2], rel=1e-4)  # both groups: the whole batch
