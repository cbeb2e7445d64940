"""The kernels' greedy LM head (csrc/greedy_head.h): a row that only needs its argmax gets the
exact logits of the tokens that can be the maximum and -inf elsewhere. Its argmax must be the full
exact row's (the same token, ties to the first index, NaN highest), its finite entries the full
row's bits, and every other row of the call the exact head's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sluice.models.kernels.packed_linear import PackedLinear
from sluice.models.quantized import QuantizedWeight, QuantType

CAP = 1024  # greedy_head.h kHeadCandidateCap


@pytest.fixture(scope="module")
def head(ops):
    from gguf import GGUFReader

    from sluice.models.loader import default_model_path

    t = {t.name: t for t in GGUFReader(str(default_model_path())).tensors}["token_embd.weight"]
    n, k = int(t.shape[1]), int(t.shape[0])
    w = QuantizedWeight.from_blocks(QuantType.Q8_0, n, k, t.data)
    return PackedLinear(ops, w), w


def _q8_matrix(q: np.ndarray, d: np.ndarray) -> QuantizedWeight:
    """A Q8_0 matrix from its integers q [N, K] (int8) and block scales d [N, K/32] (fp16)."""
    n, k = q.shape
    blocks = np.empty((n, k // 32, 34), dtype=np.uint8)
    blocks[:, :, :2] = d.astype(np.float16).reshape(n, k // 32, 1).view(np.uint8)
    blocks[:, :, 2:] = q.astype(np.int8).reshape(n, k // 32, 32).view(np.uint8)
    return QuantizedWeight.from_blocks(QuantType.Q8_0, n, k, blocks.reshape(n, -1))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _check(lin: PackedLinear, x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Compares linear_q8_argmax (the op itself: PackedLinear.argmax_logits sends a call with
    many full rows to the full head) with the exact head; returns the candidates per argmax row."""
    full = lin(x)
    bounds = lin.prepare_argmax()
    got = lin.ops.linear_q8_argmax(
        x, lin.packed, lin.out_features, lin.in_features, bounds, torch.tensor(rows, dtype=torch.int64)
    )
    assert got.shape == full.shape
    others = [r for r in range(x.shape[0]) if r not in rows]
    assert torch.equal(_bits(got[others]), _bits(full[others])), "a row outside `rows` is not the exact head's"
    picked = got[rows]
    assert torch.equal(picked.argmax(dim=-1), full[rows].argmax(dim=-1)), "an argmax row picks another token"
    kept = ~torch.isneginf(picked)
    assert torch.equal(_bits(picked[kept]), _bits(full[rows][kept])), "a candidate's logit is not the exact head's"
    return kept.sum(dim=-1)


def test_argmax_rows_keep_the_exact_argmax_on_every_isa(ops, head):
    lin, w = head
    dense = w.dequantize()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, w.cols, generator=g) * 2.0
    x[8:12] = dense[[17, 503, 4096, 49151]] * 3.0  # a clear winner
    x[12:16] = (dense[[100, 200, 300, 400]] + dense[[101, 201, 301, 401]]) * 2.0  # two close tokens
    x[16] = dense[7] * 1e-3  # small values: the scales are small but normal
    for isa in ops.available_isas():
        ops.set_isa(isa)
        counts = _check(lin, x, list(range(24)))
        # the filter filters: all but a few of the 49,152 logits are skipped (a row in full would
        # still be right, so this is what keeps the test from passing with the filter broken)
        assert int(counts.max()) < 2000 and float(counts.float().median()) < 200, counts.tolist()
        _check(lin, x, [0, 3, 9, 13, 23])  # mixed: the other rows exact, in one call


def test_the_exact_winner_is_kept_where_the_rounded_activations_favour_another(ops):
    # x rounds to integers here (its block's max is 127, so the scale is 1): token 10 sums two
    # 0.49s (exact 0.98, rounded 0), token 20 one 0.51 (exact 0.51, rounded 1). The approximation
    # ranks 20 first; only the bound keeps 10, the exact winner, among the candidates.
    q = np.zeros((64, 32), dtype=np.int64)
    q[10, [1, 2]] = 1
    q[20, 3] = 1
    w = _q8_matrix(q, np.ones((64, 1)))
    lin = PackedLinear(ops, w)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2], x[0, 3] = 127.0, 0.49, 0.49, 0.51
    _check(lin, x, [0])
    assert lin.argmax_logits(x, torch.tensor([0]))[0].argmax().item() == 10


def test_rows_the_bound_cannot_cover_are_computed_in_full(ops, head):
    lin, w = head
    x = torch.randn(6, w.cols, generator=torch.Generator().manual_seed(1))
    x[0] = 0.0  # every logit 0: all tie, the first wins
    x[1, 5] = float("nan")  # every logit NaN
    x[2, 9] = float("inf")
    x[3] = 1e-41  # subnormal activations: the rounding's scale would underflow
    x[4, :32] = 1e-42
    _check(lin, x, list(range(6)))
    got = lin.argmax_logits(x, torch.arange(6))
    assert torch.equal(_bits(got[:4]), _bits(lin(x)[:4]))  # in full, every bit the exact head's
    assert got[0].argmax().item() == 0 and got[1].argmax().item() == 0


def test_ties_go_to_the_first_token_and_too_many_candidates_fall_back_to_the_full_row(ops):
    g = np.random.default_rng(2)
    q = g.integers(-127, 128, size=(3000, 64))
    q[[40, 41, 2999]] = q[7]  # tokens 7, 40, 41 and 2999 identical
    d = g.uniform(0.001, 0.01, size=(3000, 2))
    d[[40, 41, 2999]] = d[7]
    w = _q8_matrix(q, d)
    lin = PackedLinear(ops, w)
    x = w.dequantize()[[7, 0]].clone()
    x[1] = 0.0
    x[1, 3] = 1.0  # logits d * q[:, 3]: many near ties, but one maximum
    counts = _check(lin, x, [0, 1])
    got = lin.argmax_logits(x, torch.tensor([0, 1]))
    assert got[0].argmax().item() == 7  # the first of four equal maxima
    assert counts[0].item() < CAP
    same = _q8_matrix(np.tile(q[:1], (2 * CAP, 1)), np.tile(d[:1], (2 * CAP, 1)))  # 2,048 equal tokens
    lin = PackedLinear(ops, same)
    xs = same.dequantize()[:2].clone()
    counts = _check(lin, xs, [0, 1])
    assert counts.tolist() == [2 * CAP, 2 * CAP]  # past the cap: the exact row
    assert lin.argmax_logits(xs, torch.tensor([0])).argmax(dim=-1)[0].item() == 0


def test_only_a_q8_0_head_without_bias_takes_the_argmax_path(ops, head):
    lin, w = head
    x = torch.randn(2, w.cols, generator=torch.Generator().manual_seed(3))
    biased = PackedLinear(ops, w, bias=torch.zeros(w.rows))
    assert torch.equal(biased.argmax_logits(x, torch.tensor([0, 1])), biased(x))
    assert torch.equal(lin.argmax_logits(x, torch.tensor([], dtype=torch.int64)), lin(x))
    with pytest.raises(RuntimeError, match="out of range"):
        ops.linear_q8_argmax(x, lin.packed, w.rows, w.cols, lin.prepare_argmax(), torch.tensor([2]))


def test_a_call_with_many_full_rows_takes_the_full_head(ops, head):
    lin, w = head
    x = torch.randn(14, w.cols, generator=torch.Generator().manual_seed(4))
    assert torch.equal(lin.argmax_logits(x, torch.arange(6)), lin(x))  # 8 full rows for 6 argmax rows: full
    got = lin.argmax_logits(x, torch.arange(12))  # 2 full rows for 12: the greedy head
    assert torch.isneginf(got[:12]).any() and torch.equal(got[12:], lin(x)[12:])
