"""Activation checkpointing (`--activation-checkpointing`): each decoder layer's activations are
recomputed in the backward pass instead of kept; the arithmetic is the same, so the losses equal
the run without it. The memory saved and the time it costs are measured in
bench/train/activation_checkpointing.py (docs/BENCHMARKS.md), not asserted here."""

from __future__ import annotations

import pytest

from tests.system.train.conftest import COMMON, losses, run_in_process


def test_activation_checkpointing_trains_the_same_losses(train_dir, tiny_folder, chat_data, one_run):
    out = run_in_process(
        "--data",
        str(chat_data),
        "--out",
        str(train_dir / "act-ckpt"),
        "--model",
        str(tiny_folder),
        "--nproc",
        "1",
        "--activation-checkpointing",
        *COMMON,
    )
    assert losses(out) == pytest.approx(losses(one_run), rel=1e-6)
