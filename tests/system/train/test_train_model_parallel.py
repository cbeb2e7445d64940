"""Model parallelism is exact: tensor parallel and pipeline parallel on 2 ranks
give, step by step, the loss and the gradient norm of one process on the same global batch
(fp32 tolerance), through the real `sluice train run`, and a checkpoint written by one mode
resumes in another (DCP reshards DTensor shards into pipeline stages).

Lean on purpose (each torchrun start costs 20-50 s on busy cores): the tensor-parallel run trains
steps 1-4, a 1F1B pipeline resumes its checkpoint for steps 5-6, a GPipe pipeline (2 micro-batches
of 2 rows) resumes that for steps 7-8. FSDP2 x TP runs 4 ranks for 2 steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.system.train.conftest import COMMON, STEPS, losses, run_in_process, run_train

REL_TOL = 1e-4  # as for data parallelism: fp32 summation order differs (all-reduced halves)


def _norms(run: Path) -> list[float]:
    return [json.loads(x)["grad_norm"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _args(out: Path, chat_data: Path, tiny_folder: Path, *extra: str) -> list[str]:
    # COMMON ends with --max-steps N --threads 1; a later --max-steps wins
    return ["--data", str(chat_data), "--out", str(out), "--model", str(tiny_folder), "--nproc", "2", *COMMON, *extra]


def test_tensor_parallel_then_1f1b_pipeline_resume_equal_one_process(train_dir, tiny_folder, chat_data, one_run):
    out = train_dir / "tp-then-pp"
    half = STEPS // 2
    # an asynchronous checkpoint of DTensor shards at step 2, the final (synchronous) one at 4
    proc = run_train(
        *_args(out, chat_data, tiny_folder, "--parallel", "tp", "--max-steps", str(half), "--checkpoint-every", "2")
    )
    assert "world 2, tp, starting at step 0" in proc.stderr
    assert losses(out) == pytest.approx(losses(one_run)[:half], rel=REL_TOL)
    assert _norms(out) == pytest.approx(_norms(one_run)[:half], rel=REL_TOL), "gradients equal too"
    # 7 all-reduces of the hidden states per layer (3) and step: 4 rows x 32 tokens x 64 wide x fp32
    tp_steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {m["comm_bytes"] for m in tp_steps} == {7 * 3 * 4 * 32 * 64 * 4}
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-00000002", "step-00000004"]
    three = half + 2  # 1F1B for two steps, then GPipe resumes 1F1B's checkpoint for the last two
    proc = run_train(
        *_args(
            out,
            chat_data,
            tiny_folder,
            "--parallel",
            "pp",
            "--pp-schedule",
            "1f1b",
            "--micro-batch-size",
            "1",
            "--max-steps",
            str(three),
            "--checkpoint-every",
            "2",
        )
    )
    assert f"world 2, pp, resumed from step {half}" in proc.stderr
    assert losses(out) == pytest.approx(losses(one_run)[:three], rel=REL_TOL)
    assert _norms(out) == pytest.approx(_norms(one_run)[:three], rel=REL_TOL)
    proc = run_train(
        *_args(out, chat_data, tiny_folder, "--parallel", "pp", "--pp-schedule", "gpipe", "--micro-batch-size", "2")
    )
    assert f"world 2, pp, resumed from step {three}, 2 micro-batches per step" in proc.stderr
    assert losses(out) == pytest.approx(losses(one_run), rel=REL_TOL)
    assert _norms(out) == pytest.approx(_norms(one_run), rel=REL_TOL)
    # rank 0, the first stage, sends each step's hidden states: 4 rows x 32 tokens x 64 wide x fp32
    pp_steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][half:]
    assert {m["comm_bytes"] for m in pp_steps} == {4 * 32 * 64 * 4}


def test_fsdp2_times_tensor_parallel_on_a_2x2_mesh_equals_one_process(train_dir, tiny_folder, chat_data, one_run):
    """The supported composition (docs/TRAINING.md): FSDP2 over 2 groups of 2 tensor-parallel
    ranks. Two steps: four processes are the suite's largest group, and the first steps already
    exercise every collective (all-gather, reduce-scatter, the tensor-parallel all-reduces)."""
    out = train_dir / "fsdp-tp"
    args = [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "4",
        *COMMON,
        "--parallel",
        "fsdp_tp",
        "--tp-size",
        "2",
        "--max-steps",
        "2",
    ]
    proc = run_train(*args)
    assert "world 4, fsdp_tp, starting at step 0" in proc.stderr
    assert losses(out) == pytest.approx(losses(one_run)[:2], rel=REL_TOL)
    assert _norms(out) == pytest.approx(_norms(one_run)[:2], rel=REL_TOL), "gradients equal too"


@pytest.mark.parametrize(
    "mode",
    [
        ("--parallel", "tp"),
        ("--parallel", "pp", "--pp-schedule", "gpipe", "--micro-batch-size", "2"),
        ("--parallel", "pp", "--pp-schedule", "1f1b", "--micro-batch-size", "1"),
    ],
    ids=["tp", "pp-gpipe", "pp-1f1b"],
)
def test_the_gradient_norm_at_step_1_equals_one_process_to_ddp_precision(mode, train_dir, chat_data, tmp_path):
    """random:tiny ties its embeddings to the head, over the bundled tokenizer's 49,152 tokens: a
    3.1M-element gradient, replicated under tp and on both ends of a pipeline. Same weights, same
    rows: the norm must be one process's (it was 1.75e-5 off, issue 40)."""
    args = [
        "--data",
        str(chat_data),
        "--model",
        "random:tiny",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--lr",
        "3e-3",
        "--threads",
        "1",
        "--max-steps",
        "1",
    ]
    one = train_dir / "norm-one"
    if not (one / "metrics.jsonl").exists():
        run_in_process(*args, "--out", str(one), "--nproc", "1")
    run_train(*args, "--out", str(tmp_path / "run"), "--nproc", "2", *mode)
    assert _norms(tmp_path / "run") == pytest.approx(_norms(one), rel=1e-6)
    assert losses(tmp_path / "run") == pytest.approx(losses(one), rel=1e-7)
