"""LoRA settings: the flags and train.toml, and every combination refused before a worker starts;
what a frozen base changes in the checkpoint options and the FLOPs counted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sluice.train.errors import TrainConfigError
from sluice.train.model.lora_spec import LoraTarget, targets_of
from sluice.train.settings import load_settings

BASE = {"data": "d.jsonl", "out": "o", "max_steps": 1}


def test_flags_and_file_give_the_same_lora_settings(tmp_path: Path):
    cfg = tmp_path / "train.toml"
    cfg.write_text(
        'data = "d.jsonl"\nout = "o"\nmax_steps = 1\nlora_rank = 8\nlora_alpha = 16\n'
        'lora_dropout = 0.05\nlora_targets = ["q", "v", "down"]\n'
    )
    from_file = load_settings(cfg, {})
    from_flags = load_settings(
        None, {**BASE, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": ["q", "v", "down"]}
    )
    for s in (from_file, from_flags):
        assert (s.lora_rank, s.lora_alpha, s.lora_dropout) == (8, 16.0, 0.05)
        assert targets_of(s.lora_targets) == ["q_proj", "v_proj", "down_proj"]
    assert targets_of(None) == [t.module for t in LoraTarget]  # the default: all seven linears
    assert load_settings(None, BASE).lora_rank is None  # full fine-tuning


@pytest.mark.parametrize(
    "given, problem",
    [
        ({"lora_rank": 0}, "--lora-rank: Input should be greater than 0"),
        ({"lora_rank": -4}, "--lora-rank: Input should be greater than 0"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, "--lora-alpha: Input should be greater than 0"),
        ({"lora_rank": 4, "lora_alpha": -1.0}, "--lora-alpha: Input should be greater than 0"),
        ({"lora_rank": 4, "lora_dropout": 1.0}, "--lora-dropout: Input should be less than 1"),
        ({"lora_rank": 4, "lora_dropout": -0.1}, "--lora-dropout: Input should be greater than or equal to 0"),
        (
            {"lora_rank": 4, "lora_targets": ["q", "qkv"]},
            "--lora-targets: Input should be 'q', 'k', 'v', 'o', 'gate', 'up' or 'down'",
        ),
        ({"lora_rank": 4, "lora_targets": ["lm_head"]}, "--lora-targets: Input should be 'q'"),
        ({"lora_rank": 4, "lora_targets": []}, "lora_targets: name at least one of q, k, v, o, gate, up, down"),
        ({"lora_rank": 4, "lora_targets": ["v", "v"]}, "lora_targets: 'v' is listed twice"),
        ({"lora_alpha": 16.0}, "lora_alpha applies to a LoRA run: set lora_rank"),
        ({"lora_dropout": 0.1}, "lora_dropout applies to a LoRA run"),
        ({"lora_targets": ["q"]}, "lora_targets applies to a LoRA run"),
        ({"lora_rank": 4, "parallel": "tp", "nproc": 2}, "not with parallel = tp (tensor and pipeline plans"),
        ({"lora_rank": 4, "parallel": "pp", "nproc": 2}, "not with parallel = pp"),
        ({"lora_rank": 4, "parallel": "fsdp_tp", "nproc": 4}, "not with parallel = fsdp_tp"),
        ({"lora_rank": 4, "parallel": "ep", "nproc": 2, "moe_experts": 2}, "not with parallel = ep"),
        ({"lora_rank": 4, "moe_experts": 4}, "not with moe_experts"),
    ],
)
def test_what_does_not_compose_is_refused_naming_why(given: dict, problem: str):
    with pytest.raises(TrainConfigError) as err:
        load_settings(None, {**BASE, **given})
    assert problem in "\n".join(err.value.problems)


@pytest.mark.parametrize(
    "flags, problem",
    [
        (
            ["--lora-rank", "4", "--parallel", "tp", "--nproc", "2"],
            "a LoRA run trains on one process, ddp or fsdp, not with parallel = tp",
        ),
        (
            ["--lora-rank", "4", "--lora-targets", "q,x"],
            "--lora-targets: Input should be 'q', 'k', 'v', 'o', 'gate', 'up' or 'down'",
        ),
        (["--lora-rank", "0"], "--lora-rank: Input should be greater than 0"),
        (["--lora-rank", "4", "--lora-dropout", "1"], "--lora-dropout: Input should be less than 1"),
    ],
)
def test_the_cli_refuses_before_any_worker_starts(flags: list[str], problem: str, tmp_path: Path, capsys):
    from sluice.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    out = tmp_path / "run"
    assert main(["train", "run", "--data", str(data), "--out", str(out), "--max-steps", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: invalid training settings:") and "Traceback" not in err
    assert problem in err
    assert not out.exists()  # nothing prepared, no torchrun started


def test_a_lora_run_is_resumed_only_with_the_same_adapter_shape(tmp_path: Path):
    from sluice.train.launch import check_same_run
    from sluice.train.settings import write_resolved

    lora = {**BASE, "out": str(tmp_path), "lora_rank": 4}
    write_resolved(load_settings(None, lora), tmp_path / "resolved_config.json")
    check_same_run(load_settings(None, {**lora, "max_steps": 9, "lora_dropout": 0.1}), tmp_path)  # may change
    with pytest.raises(TrainConfigError, match=r"different lora_rank \(lora_rank: 4 -> 8\)"):
        check_same_run(load_settings(None, {**lora, "lora_rank": 8}), tmp_path)
    with pytest.raises(TrainConfigError, match=r"different lora_targets"):
        check_same_run(load_settings(None, {**lora, "lora_targets": ["q"]}), tmp_path)
    with pytest.raises(TrainConfigError, match=r"different lora_rank \(lora_rank: 4 -> None\)"):
        check_same_run(load_settings(None, {**BASE, "out": str(tmp_path)}), tmp_path)  # full fine-tuning


def _tiny_lora(rank: int = 2, tied: bool = False, seed: int = 0):
    import transformers

    from sluice.train.model.lora import add_lora

    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    module = transformers.LlamaForCausalLM(cfg)
    add_lora(module, load_settings(None, {**BASE, "lora_rank": rank, "model": "random:tiny", "seed": seed}))
    return module


def test_the_checkpoint_options_and_the_flops_see_the_frozen_base():
    from sluice.train.checkpoint.checkpointer import state_options
    from sluice.train.observe.flops import matmul_params

    module = _tiny_lora()
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert state_options(module).ignore_frozen_params and not state_options(module).strict
    plain = torch.nn.Linear(2, 2)
    assert not state_options(plain).ignore_frozen_params and state_options(plain).strict
    # a frozen parameter costs 4 FLOPs per token (no gradient of its own), a trained one 6
    frozen = sum(p.numel() for p in module.parameters() if not p.requires_grad) - 64 * 16  # the embedding: a lookup
    train = sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert matmul_params(module) == round(frozen * 4 / 6 + train)


def test_a_tied_head_stays_out_of_a_lora_checkpoint(tmp_path: Path):
    """A frozen embedding tied to the head has two names; neither is saved (the bundled model ties)."""
    from torch.distributed.checkpoint import FileSystemReader

    from sluice.train.checkpoint.checkpointer import Checkpointer
    from sluice.train.model.build import trainable

    module = _tiny_lora(tied=True)
    assert module.lm_head.weight is module.model.embed_tokens.weight
    with torch.no_grad():
        for p in trainable(module):
            p.normal_()
    Checkpointer(tmp_path, 1, False).save(module, torch.optim.AdamW(trainable(module)), step=1, wait=True)
    folder = next(tmp_path.glob("step-*"))
    keys = [k for k in FileSystemReader(str(folder)).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys), keys
    fresh = _tiny_lora(tied=True, seed=1)  # other adapter values, the restore replaces them
    assert Checkpointer(tmp_path, 1, False).restore(fresh, torch.optim.AdamW(trainable(fresh))) == 1
    for a, b in zip(trainable(module), trainable(fresh)):
        assert torch.equal(a, b)
