"""Data parallelism is exact: DDP and FSDP2 on 2 ranks give, step by step, the loss of one
process on the same global batch (fp32 tolerance), through the real `sluice train run`."""

from __future__ import annotations

import json

import pytest

from tests.system.train.conftest import COMMON, STEPS, losses, run_train

REL_TOL = 1e-4  # fp32 summation order differs (two halves all-reduced vs one sum); Adam amplifies a little


def test_ddp_on_two_ranks_equals_one_process(one_run, ddp2_run):
    ref = losses(one_run)
    assert len(ref) == STEPS and ref[-1] < ref[0], "the loss falls: it really trains"
    assert losses(ddp2_run) == pytest.approx(ref, rel=REL_TOL)
    first = json.loads((ddp2_run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["world_size"] == 2 and first["comm_bytes"] > 0 and first["comm_time"] is not None
    assert {"step", "loss", "tokens", "step_time", "comm_bytes", "comm_time", "lr"} <= set(first)
    saved = json.loads((ddp2_run / "resolved_config.json").read_text())
    assert saved["nproc"] == 2 and saved["max_steps"] == STEPS


def test_step_time_split_mfu_and_the_prometheus_textfile(train_dir, ddp2_run):
    lines = [json.loads(x) for x in (ddp2_run / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        parts = [m["data_time"], m["compute_time"], m["comm_wait_time"], m["checkpoint_time"], m["other_time"]]
        assert min(parts) >= 0 and sum(parts) == pytest.approx(m["step_time"], rel=1e-6)
        assert m["comm_wait_time"] > 0  # at least the step's closing all-reduce
        assert 0 < m["mfu"] < 1 and m["tokens_per_s"] > 0 and m["cpu_time"] > 0
    assert sum(m["checkpoint_time"] > 0 for m in lines) >= 2  # steps 3, 6 and the final one
    prom = (train_dir / "prom" / "ddp2.prom").read_text()
    assert f'sluice_train_step{{run="ddp2"}} {float(STEPS)!r}' in prom
    assert 'sluice_train_step_part_seconds{run="ddp2",part="comm"}' in prom


def test_fsdp2_on_two_ranks_equals_one_process(train_dir, tiny_folder, chat_data, one_run):
    fsdp = train_dir / "fsdp2"
    run_train(
        "--data",
        str(chat_data),
        "--out",
        str(fsdp),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--parallel",
        "fsdp",
        *COMMON,
    )
    assert losses(fsdp) == pytest.approx(losses(one_run), rel=REL_TOL)
