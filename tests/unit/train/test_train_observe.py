"""Observability arithmetic: the step-time split adds up, the exposed communication of DDP's
buckets, 6·N·D and MFU, and the sinks (a Prometheus textfile, TensorBoard event files)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch

from sluice.train.metrics import MetricsWriter, StepMetrics, read_metrics
from sluice.train.observe.flops import matmul_params, measure_peak_flops, mfu, step_flops
from sluice.train.observe.sinks import PARTS, PrometheusTextfile, TensorBoardSink, open_sinks, render_textfile
from sluice.train.observe.step_split import COLUMNS, StepSplit, split_step
from sluice.train.outcome import StepOutcome
from sluice.train.parallel.comm_stats import CommStats
from sluice.train.settings import load_settings
from sluice.train.step_metrics import StepLine


def _metrics(step: int = 3, **kw) -> StepMetrics:
    base = dict(
        step=step,
        loss=2.5,
        tokens=100,
        tokens_seen=128,
        lr=1e-3,
        grad_norm=0.7,
        step_time=2.0,
        data_time=0.1,
        compute_time=1.2,
        comm_wait_time=0.4,
        checkpoint_time=0.2,
        other_time=0.1,
        comm_bytes=4096,
        comm_time=None,
        tokens_per_s=64.0,
        cpu_time=1.9,
        mfu=0.25,
        epoch=0.5,
        world_size=2,
    )
    return StepMetrics(**{**base, **kw})


def test_the_split_adds_up_to_the_step_and_comm_is_part_of_the_train_interval():
    s = split_step(2.0, data=0.1, train=1.6, comm_wait=0.4, checkpoint=0.2)
    assert (s.data, s.comm, s.checkpoint) == (0.1, 0.4, 0.2)
    assert s.compute == pytest.approx(1.2) and s.other == pytest.approx(0.1)
    assert s.data + s.compute + s.comm + s.checkpoint + s.other == pytest.approx(2.0)
    # a wait measured longer than the interval it lies in (clock granularity) never makes compute negative
    clipped = split_step(1.0, data=0.0, train=0.5, comm_wait=0.7, checkpoint=0.0)
    assert (clipped.compute, clipped.comm) == (0.0, 0.5)
    assert split_step(1.0, data=0.5, train=0.6, comm_wait=0.0, checkpoint=0.0).other == 0.0


def test_exposed_communication_is_the_tail_after_the_last_bucket():
    stats = CommStats()
    # three buckets: issued at 1.0, 2.0, 3.0 (the backward pass ends with the third); done at
    # 2.5, 3.1, 3.6: only 3.0 → 3.6 was waited for, the rest overlapped the backward pass
    for issued, done in [(1.0, 2.5), (2.0, 3.1), (3.0, 3.6)]:
        stats.record(issued, done)
    assert stats.take_wait() == pytest.approx(0.6)
    assert stats.take() == (0, pytest.approx(1.5 + 1.1 + 0.6))  # the overlapped durations, summed
    assert stats.take_wait() == 0.0  # reset; a step without buckets (FSDP2, one rank) waits for none


def test_six_n_d_and_mfu():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        vocab_size=100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    untied = LlamaForCausalLM(LlamaConfig(**cfg, tie_word_embeddings=False))
    tied = LlamaForCausalLM(LlamaConfig(**cfg, tie_word_embeddings=True))
    total = sum(p.numel() for p in untied.parameters())
    assert matmul_params(untied) == total - 100 * 16  # the input table is a lookup
    assert matmul_params(tied) == sum(p.numel() for p in tied.parameters())  # it is the head too
    assert step_flops(1_000_000, 2048) == 6 * 1_000_000 * 2048
    # 6·1e6·2048 = 1.2288e10 FLOPs in 0.5 s on 2 ranks of 1e11 FLOP/s each (1e11 FLOPs possible)
    assert mfu(step_flops(1_000_000, 2048), 0.5, 1e11, 2) == pytest.approx(0.12288)
    assert mfu(1.0, 0.0, 1e10, 1) is None and mfu(1.0, 1.0, 0.0, 1) is None


def test_the_measured_peak_is_a_plausible_rate():
    peak = measure_peak_flops(torch.device("cpu"), torch.float32, size=64, repeats=2)
    assert math.isfinite(peak) and 1e6 < peak < 1e15


def test_the_prometheus_textfile_parses_and_is_replaced_whole(tmp_path: Path):
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(render_textfile(_metrics(comm_time=None), "r1"))}
    assert families["sluice_train_loss"].samples[0].value == 2.5
    assert families["sluice_train_loss"].samples[0].labels == {"run": "r1"}
    assert families["sluice_train_mfu"].samples[0].value == 0.25
    parts = {s.labels["part"]: s.value for s in families["sluice_train_step_part_seconds"].samples}
    assert set(parts) == {p for p, _ in PARTS} and sum(parts.values()) == pytest.approx(2.0)
    assert "sluice_train_mfu" not in render_textfile(_metrics(mfu=None), "r1")  # unknown: left out, not 0

    path = tmp_path / "textfiles" / "train.prom"
    sink = PrometheusTextfile(path, "r1")
    sink.write(_metrics(step=1))
    sink.write(_metrics(step=2, loss=1.5))
    text = path.read_text()
    assert 'sluice_train_step{run="r1"} 2.0' in text and 'sluice_train_loss{run="r1"} 1.5' in text
    assert [p.name for p in path.parent.iterdir()] == ["train.prom"]  # no temporary file left


def test_metrics_writer_feeds_tensorboard(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    run.mkdir()
    sinks = open_sinks(True, str(tmp_path / "t.prom"), run)
    assert [type(s) for s in sinks] == [TensorBoardSink, PrometheusTextfile]
    w = MetricsWriter(run / "metrics.jsonl", True, 0, sinks)
    for step in (1, 2):
        w.write(_metrics(step=step, loss=3.0 - step))
    w.close()
    assert [m["step"] for m in read_metrics(run / "metrics.jsonl")] == [1, 2]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 2.0), (2, 1.0)]
    assert "train/mfu" in acc.Tags()["scalars"] and "train/comm_time" not in acc.Tags()["scalars"]  # None: skipped
    # resumed from step 1: step 2 is written again and TensorBoard keeps the new value only
    resumed = TensorBoardSink(run / "tensorboard", resume_step=1)
    resumed.write(_metrics(step=2, loss=0.5))
    resumed.close()
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 2.0), (2, 0.5)]


def test_observability_settings(tmp_path: Path):
    cfg = tmp_path / "train.toml"
    cfg.write_text(
        'data = "d.jsonl"\nout = "o"\nmax_steps = 1\ntensorboard = true\n'
        'prometheus_textfile = "prom/train.prom"\npeak_flops = 1e12\n'
    )
    s = load_settings(cfg, {})
    assert s.tensorboard and s.peak_flops == 1e12 and s.prometheus_textfile == str(tmp_path / "prom/train.prom")
    assert load_settings(None, {"data": "d", "out": "o", "max_steps": 1}).prometheus_textfile is None
    assert {"comm_wait_time", "other_time", "mfu"} <= {f.name for f in fields(StepMetrics)}


def test_a_step_line_is_built_from_its_parts_columns():
    """The step-time split and the ranks' spread name their own metrics.jsonl columns
    (step_split.COLUMNS, Spread.columns): together with the step's counts they fill every field,
    and the Prometheus parts are the split's parts."""
    assert list(COLUMNS) == [f.name for f in fields(StepSplit)] == [p for p, _ in PARTS]
    settings = load_settings(None, {"data": "d.jsonl", "out": "o", "max_steps": 4, "seq_len": 8, "batch_size": 4})
    outcome = StepOutcome(
        step=2,
        lr=1e-3,
        rows=[0, 1, 2, 3],
        tokens=20,
        loss=1.5,
        norm=0.5,
        stopped=False,
        nonfinite=False,
        lease_lost=False,
        retry=False,
        groups=None,
        rank_times=[0.2, 0.2, 0.9],
        extra_bytes=0,
        started=time.perf_counter() - 1.0,
        cpu_started=time.process_time(),
        data_time=0.1,
        train_time=0.6,
        comm_wait=0.2,
    )
    m = StepLine(settings, world=3, rows=16, params=1000, peak=1e12).metrics(outcome, 64, None, 0.05)
    line = asdict(m)
    assert list(line) == [f.name for f in fields(StepMetrics)]
    assert (m.step, m.tokens, m.tokens_seen, m.grad_norm, m.world_size, m.epoch) == (2, 20, 32, 0.5, 3, 0.5)
    assert (m.data_time, m.comm_wait_time, m.checkpoint_time) == (0.1, 0.2, 0.05)
    assert m.compute_time == pytest.approx(0.4)
    assert sum(line[column] for column in COLUMNS.values()) == pytest.approx(m.step_time)
    assert (m.rank_compute_max, m.rank_compute_median, m.stragglers) == (0.9, 0.2, [2])
