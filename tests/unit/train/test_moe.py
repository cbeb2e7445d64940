"""The MoE feed-forward, in one process: equal to transformers' Mixtral block with the same
weights, an upcycled model computes what the dense one did, the load-balancing loss is 1 per
row when balanced; the settings that go with it; the expert-major reordering of arrived rows."""

from __future__ import annotations

import pytest
import torch

from sluice.train.errors import TrainConfigError
from sluice.train.model.moe import make_moe, take_aux_loss
from sluice.train.settings import load_settings


def _dense():
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_theta=10000.0,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg)


def test_the_block_equals_transformers_mixtral_block_and_upcycling_keeps_the_dense_output():
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    dense = _dense()
    moe = make_moe(dense, experts=4, top_k=2, aux_coef=0.01, seed=0, upcycle=False)
    ours = moe.model.layers[0].mlp
    ref = MixtralSparseMoeBlock(moe.config)
    ref.load_state_dict(ours.state_dict())  # the same names: a checkpoint is a Mixtral checkpoint
    h = torch.randn(3, 5, 16)
    assert torch.allclose(ours(h), ref(h), atol=1e-6)
    ids = torch.randint(0, 40, (2, 7))
    up = make_moe(dense, experts=4, top_k=2, aux_coef=0.01, seed=0, upcycle=True)
    assert torch.allclose(up(input_ids=ids).logits, dense(input_ids=ids).logits, atol=1e-5)
    aux = take_aux_loss(up)  # 2 layers × 2 rows, each ≥ 1 (1 = perfectly balanced), × 0.01
    assert aux is not None and aux.item() >= 0.01 * 4 - 1e-6 and take_aux_loss(up) is None


def test_arrived_rows_are_regrouped_expert_major():
    from sluice.train.parallel.expert import _expert_major

    counts = torch.tensor([[1, 2], [3, 0]])  # rows from source 0: e0 ×1, e1 ×2; from source 1: e0 ×3
    assert _expert_major(counts).tolist() == [0, 3, 4, 5, 1, 2]


def test_moe_and_elastic_and_store_settings_are_checked():
    base = {"data": "d", "out": "o", "max_steps": 1}
    s = load_settings(None, {**base, "moe_experts": 4, "parallel": "ep", "nproc": 2, "batch_size": 4})
    assert s.moe_top_k == 2 and not s.elastic
    for bad, match in [
        ({"parallel": "ep"}, "set moe_experts"),
        ({"moe_experts": 3, "parallel": "ep", "nproc": 2, "batch_size": 4}, "multiple of nproc"),
        ({"moe_experts": 2, "moe_top_k": 3}, "must not exceed"),
        ({"nnodes": "1:2"}, "rdzv_endpoint"),
        ({"checkpoint_store": "gs://b/p"}, "checkpoint-store"),
    ]:
        with pytest.raises(TrainConfigError, match=match):
            load_settings(None, {**base, **bad})
    assert load_settings(None, {**base, "nnodes": "1:2", "rdzv_endpoint": "h:1"}).elastic
    assert load_settings(None, {**base, "checkpoint_store": "s3://bucket/runs/r1"}).checkpoint_store


def test_the_hold_fault_parses():
    from sluice.train.faults import parse

    assert parse("hold:2:4,hold:1:7,delay:0.1").holds == ((2, 4), (1, 7))
