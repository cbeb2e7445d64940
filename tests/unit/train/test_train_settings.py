"""Training settings: one strict file, FILE:LINE errors, flags over the file; lr; checkpoint layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.train.checkpoint import layout
from sluice.train.errors import TrainConfigError
from sluice.train.lr import lr_at
from sluice.train.metrics import MetricsWriter, StepMetrics, read_metrics
from sluice.train.settings import LrSchedule, Parallel, load_settings


def test_a_file_with_flags_on_top(tmp_path: Path):
    cfg = tmp_path / "train.toml"
    cfg.write_text('data = "chat.jsonl"\nout = "runs/r1"\nmax_steps = 10\nparallel = "fsdp"\nnproc = 2\n')
    s = load_settings(cfg, {"max_steps": 20, "lr": None})
    assert s.max_steps == 20 and s.parallel is Parallel.FSDP and s.lr == 2e-5
    assert s.data == str(tmp_path / "chat.jsonl")  # relative to the file


def test_every_problem_is_named_with_its_line(tmp_path: Path):
    cfg = tmp_path / "train.toml"
    cfg.write_text('data = "d.jsonl"\nout = "o"\n\nmax_steps = "ten"\nbatch_sise = 4\nparallel = "zero"\n')
    with pytest.raises(TrainConfigError) as err:
        load_settings(cfg, {})
    problems = "\n".join(err.value.problems)
    assert f"{cfg}:4: max_steps: " in problems
    assert f"{cfg}:5: batch_sise: unknown field" in problems
    assert f"{cfg}:6: parallel: " in problems


def test_flags_are_named_as_flags_and_cross_checks_hold():
    with pytest.raises(TrainConfigError, match="--seq-len: "):
        load_settings(None, {"data": "d", "out": "o", "max_steps": 1, "seq_len": 2})
    with pytest.raises(TrainConfigError, match="multiple of nproc"):
        load_settings(None, {"data": "d", "out": "o", "max_steps": 1, "nproc": 3, "batch_size": 4})
    with pytest.raises(TrainConfigError, match="unknown preset"):
        load_settings(None, {"data": "d", "out": "o", "max_steps": 1, "model": "random:huge"})
    with pytest.raises(TrainConfigError, match="max_steps: required"):
        load_settings(None, {"data": "d", "out": "o"})


def test_micro_batches_follow_the_world_size():
    s = load_settings(None, {"data": "d", "out": "o", "max_steps": 1, "batch_size": 8, "micro_batch_size": 2})
    assert [s.dims(world).micro_batch(s.batch_size, s.micro_batch_size) for world in (1, 2, 8)] == [2, 2, 1]


def test_learning_rate_is_a_function_of_the_step():
    assert lr_at(1, 1.0, 4, 100, LrSchedule.CONSTANT) == 0.25
    assert lr_at(50, 1.0, 4, 100, LrSchedule.CONSTANT) == 1.0
    assert lr_at(4, 1.0, 4, 100, LrSchedule.COSINE) == 1.0
    assert lr_at(100, 1.0, 4, 100, LrSchedule.COSINE) == pytest.approx(0.1)


def _written(folder: Path) -> Path:
    """A checkpoint folder as DCP and the manifest leave it (contents do not matter here)."""
    folder.mkdir()
    (folder / layout.METADATA).write_bytes(b"x")
    (folder / layout.MANIFEST).write_text("{}")
    return folder


def test_a_partial_checkpoint_never_counts_and_only_k_are_kept(tmp_path: Path):
    for step in (2, 4, 6):
        _written(layout.partial_dir(tmp_path, step))
        layout.finalize(tmp_path, step, keep=2)
    layout.partial_dir(tmp_path, 8).mkdir()  # a crash mid-write
    assert layout.complete_steps(tmp_path) == [4, 6]
    assert layout.latest(tmp_path) == (6, layout.step_dir(tmp_path, 6))
    layout.recover_partials(tmp_path, keep=2)
    assert not layout.partial_dir(tmp_path, 8).exists() and layout.complete_steps(tmp_path) == [4, 6]
    # .metadata written, the manifest not yet: half-written, removed
    layout.partial_dir(tmp_path, 8).mkdir()
    (layout.partial_dir(tmp_path, 8) / layout.METADATA).write_bytes(b"x")
    layout.recover_partials(tmp_path, keep=2)
    assert not layout.partial_dir(tmp_path, 8).exists()
    # written whole (the manifest, written last, is there) but not yet published when the crash came
    _written(layout.partial_dir(tmp_path, 8))
    layout.recover_partials(tmp_path, keep=2)
    assert layout.complete_steps(tmp_path) == [6, 8]


def test_a_step_folder_without_metadata_is_not_complete(tmp_path: Path):
    for step in (2, 4):
        _written(layout.partial_dir(tmp_path, step))
        layout.finalize(tmp_path, step, keep=3)
    (layout.step_dir(tmp_path, 4) / layout.METADATA).unlink()
    assert layout.published_steps(tmp_path) == [2, 4]
    latest = layout.latest(tmp_path)
    assert layout.complete_steps(tmp_path) == [2] and latest is not None and latest[0] == 2


def test_metrics_after_the_resumed_step_are_dropped(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 6)) + '{"step": 6, "lo')
    w = MetricsWriter(path, True, resume_step=3)
    w.write(StepMetrics(4, 0.5, 1, 1, 0.1, 1.0, 0.1, 0.0, 0.1, 0.0, 0.0, 0.0, 0, None, 10.0, 0.1, None, 0.1, 2))
    w.close()
    assert [m["step"] for m in read_metrics(path)] == [1, 2, 3, 4]


def test_a_non_finite_value_is_written_as_null_and_every_line_is_strict_json(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path, True, resume_step=0)
    nan, inf = float("nan"), float("inf")
    w.write(
        StepMetrics(
            1, nan, 1, 1, 0.1, inf, 0.1, 0.0, 0.1, 0.0, 0.0, 0.0, 0, None, 10.0, 0.1, None, 0.1, 2, skipped=True
        )
    )
    w.close()

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    lines = [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]
    assert lines[0]["loss"] is None and lines[0]["grad_norm"] is None and lines[0]["skipped"] is True


def test_a_run_folder_resumes_only_the_same_run(tmp_path: Path):
    from sluice.train.launch import check_same_run
    from sluice.train.settings import write_resolved

    base = {"data": "d.jsonl", "out": str(tmp_path), "max_steps": 10}
    write_resolved(load_settings(None, base), tmp_path / "resolved_config.json")
    check_same_run(load_settings(None, {**base, "max_steps": 50, "nproc": 2, "batch_size": 4}), tmp_path)
    with pytest.raises(TrainConfigError, match=r"different seq_len, seed \(seq_len: 512 -> 64; seed: 0 -> 1\)"):
        check_same_run(load_settings(None, {**base, "seq_len": 64, "seed": 1}), tmp_path)


@pytest.mark.parametrize("below", ["", "sub/run"])
def test_out_naming_a_file_is_one_error_line(below: str, tmp_path: Path, capsys):
    from sluice.cli import main

    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    out = taken / below if below else taken
    assert main(["train", "run", "--data", str(data), "--out", str(out), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: invalid training settings:") and "Traceback" not in err
    assert f"out: {out} {'is a file' if not below else f'is below {taken}, a file'}" in err
