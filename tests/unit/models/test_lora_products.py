"""LoRA's per-row low-rank products (models/lora/batch.py, csrc/lora.h) against their definition:
y[row] += scale · (x[row] Aᵀ) Bᵀ per targeted part, each row with its own adapter, base rows
untouched; the kernels bit-identical across ISAs, thread counts and batch compositions."""

from __future__ import annotations

import pytest
import torch

from sluice.models.config import ModelConfig
from sluice.models.lora.adapter_folder import linear_shape
from sluice.models.lora.batch import BASE, LoraBatch
from sluice.models.lora.weights import FUSED, LoraWeights, Module
from tests.lora_adapters import random_adapter

CFG = ModelConfig(
    "llama",
    vocab_size=100,
    hidden_size=64,
    intermediate_size=160,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position=64,
)
SIZES = {Module.QKV: (64 + 32 + 32, 64), Module.O_PROJ: (64, 64), Module.GATE_UP: (320, 64), Module.DOWN: (64, 160)}


def _reference(y, x, adapters, slots, layer, module):
    """The definition in float64, target by target."""
    out = y.double().clone()
    for row, slot in enumerate(slots):
        if slot == BASE:
            continue
        tensors = adapters[slot]
        off = 0
        for target in FUSED[module]:
            n = linear_shape(CFG, target)[0]
            pair = tensors.pairs.get((layer, target))
            if pair is not None:
                t = x[row].double() @ pair.a.double().T
                out[row, off : off + n] += pair.scale * (t @ pair.b.double().T)
            off += n
    return out


def _case(seed=0, rows=11):
    tensors = [
        random_adapter(CFG, rank=8, seed=1),
        random_adapter(CFG, rank=4, targets=("q_proj", "v_proj", "down_proj"), seed=2),
        random_adapter(CFG, rank=16, targets=("k_proj", "o_proj", "up_proj"), seed=3),
    ]
    g = torch.Generator().manual_seed(seed)
    slots = [BASE, 0, 1, 2, 0, BASE, 2, 1, 0, 2, 1][:rows]
    return tensors, slots, g


@pytest.mark.parametrize("module", list(Module))
def test_torch_path_matches_the_definition(module):
    tensors, slots, g = _case()
    adapters = [LoraWeights(f"a{i}", t, CFG) for i, t in enumerate(tensors)]
    n, k = SIZES[module]
    x, y = torch.randn(len(slots), k, generator=g), torch.randn(len(slots), n, generator=g)
    ref = _reference(y, x, tensors, slots, 1, module)
    got = y.clone()
    LoraBatch(adapters, slots).apply(got, x, 1, module)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    base = [i for i, s in enumerate(slots) if s == BASE]
    assert torch.equal(got[base], y[base]), "base rows are left exactly as the base linear made them"


@pytest.mark.parametrize("module", list(Module))
def test_kernels_match_the_definition_on_every_isa(ops, module):
    tensors, slots, g = _case()
    adapters = [LoraWeights(f"a{i}", t, CFG, ops) for i, t in enumerate(tensors)]
    n, k = SIZES[module]
    x, y = torch.randn(len(slots), k, generator=g), torch.randn(len(slots), n, generator=g)
    ref = _reference(y, x, tensors, slots, 0, module)
    results = []
    for isa in ops.available_isas():
        ops.set_isa(isa)
        got = y.clone()
        ops.lora_apply(got, x, LoraBatch(adapters, slots, ops).native, 0, int(module))
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
        results.append(got)
    ops.set_isa("auto")
    assert all(torch.equal(r, results[0]) for r in results), "ISAs give different bits"


def test_kernels_are_batch_invariant_and_thread_invariant(ops):
    """A row's result depends on nothing but the row: alone, in a shuffled batch, on 1 or 2
    threads (the helper pool split), it is the same to the bit."""
    tensors, slots, g = _case(rows=11)
    adapters = [LoraWeights(f"a{i}", t, CFG, ops) for i, t in enumerate(tensors)]
    n, k = SIZES[Module.GATE_UP]
    x, y = torch.randn(11, k, generator=g), torch.randn(11, n, generator=g)
    full = y.clone()
    ops.lora_apply(full, x, LoraBatch(adapters, slots, ops).native, 1, int(Module.GATE_UP))
    for row in range(11):
        if slots[row] == BASE:
            assert torch.equal(full[row], y[row])
            continue
        alone = y[row : row + 1].clone()
        ops.lora_apply(alone, x[row : row + 1], LoraBatch(adapters, [slots[row]], ops).native, 1, int(Module.GATE_UP))
        assert torch.equal(alone[0], full[row])
    old_threads, old_cut = torch.get_num_threads(), ops.set_split_cut(1, 0)
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            again = y.clone()
            ops.lora_apply(again, x, LoraBatch(adapters, slots, ops).native, 1, int(Module.GATE_UP))
            assert torch.equal(again, full), f"{threads} threads"
    finally:
        torch.set_num_threads(old_threads)
        ops.set_split_cut(*old_cut)


def test_kernels_refuse_rows_past_the_output(ops):
    tensors, _, g = _case()
    adapters = [LoraWeights("a", tensors[0], CFG, ops)]
    step = LoraBatch(adapters, [BASE, BASE, 0], ops).native
    with pytest.raises(RuntimeError, match="past the step's rows"):
        ops.lora_apply(torch.zeros(2, 128), torch.zeros(2, 64), step, 0, int(Module.QKV))


def test_memory_per_adapter_is_its_fp32_weights():
    t = random_adapter(CFG, rank=8)
    w = LoraWeights("a", t, CFG)
    exact = sum(p.a.numel() + p.b.numel() for p in t.pairs.values()) * 4
    # A of a fused module is padded to 16 columns: rank 8 on q, k, v is 24 -> 32
    assert exact <= w.nbytes <= exact * 1.4
