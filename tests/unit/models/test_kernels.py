"""The CPU kernels against their definition: exact weights, batch invariance, ISA agreement,
attention and glue equal (or within rounding of) the torch path, and the fallback to torch.

Every test runs the real extension on the bundled GGUF's real blocks. On a CPU without AVX2 the
kernel tests skip (the fallback test still runs); anywhere else a failed build fails them.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sluice.models.attention import AttentionMetadata, TorchPagedAttention
from sluice.models.kernels import KernelChoice, kernel_ops
from sluice.models.quantized import QuantizedWeight, QuantType


@pytest.fixture(scope="module")
def gguf_tensors():
    from gguf import GGUFReader

    from sluice.models.loader import default_model_path

    reader = GGUFReader(str(default_model_path()))
    return {t.name: t for t in reader.tensors}


def _weight(tensors, name: str, rows: int | None = None) -> QuantizedWeight:
    t = tensors[name]
    n, k = int(t.shape[1]), int(t.shape[0])
    w = QuantizedWeight.from_blocks(QuantType(t.tensor_type.name), n, k, t.data)
    if rows is not None:  # a slice of rows keeps the identity probes small
        w = QuantizedWeight(w.qtype, rows, k, np.ascontiguousarray(w.data[:rows]))
    return w


# Q4_1 layers of both K (576 and 1536), and the Q8_0 embedding; 50 and 1000 rows are not
# multiples of the 16-row panel, so the tails are covered too.
WEIGHTS = [
    ("blk.0.ffn_gate.weight", None),
    ("blk.3.ffn_down.weight", None),
    ("blk.1.attn_k.weight", 50),
    ("token_embd.weight", 1000),
]


def _linear(ops, w: QuantizedWeight, bias=None):
    from sluice.models.kernels.packed_linear import PackedLinear

    return PackedLinear(ops, w, bias)


@pytest.mark.parametrize("name,rows", WEIGHTS)
def test_identity_returns_the_dequantized_weights_bit_for_bit_on_every_isa(ops, gguf_tensors, name, rows):
    w = _weight(gguf_tensors, name, rows)
    lin = _linear(ops, w)
    expected = w.dequantize()
    eye = torch.eye(w.cols)
    for isa in ops.available_isas():
        ops.set_isa(isa)
        got = lin(eye).T  # x = e_k selects column k of W^T
        assert torch.equal(got, expected), f"{isa}: max diff {(got - expected).abs().max().item()}"


def test_q4_1s_d_times_q_is_exact_in_fp32_so_one_fma_is_ggufs_two_roundings():
    """gemm_impl.h dequantizes Q4_1 with one fma(d, q, m); gguf's numpy code rounds d*q, then
    adds m. They agree bit for bit because d*q is exact in fp32 for every finite fp16 d and every
    q in 0..15 (at most 11 + 4 significant bits): checked here over all of them. The sum with m
    then rounds once either way; the sample below checks that too (float64 holds d*q + m exactly)."""
    d = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    d = d[np.isfinite(d)].astype(np.float32)
    for q in range(16):
        product32 = d * np.float32(q)
        assert np.array_equal(product32.astype(np.float64), d.astype(np.float64) * q), f"d*{q} rounds in fp32"
    rng = np.random.default_rng(0)
    dd = rng.choice(d, 200_000)
    mm = rng.choice(d, 200_000)
    qq = rng.integers(0, 16, 200_000).astype(np.float32)
    two_roundings = (dd * qq) + mm  # numpy float32: round(round(d*q) + m)
    one_fma = (dd.astype(np.float64) * qq + mm.astype(np.float64)).astype(np.float32)
    assert np.array_equal(two_roundings.view(np.uint32), one_fma.view(np.uint32))


@pytest.mark.parametrize("name,rows", WEIGHTS)
def test_results_are_batch_invariant_and_the_same_on_every_isa(ops, gguf_tensors, name, rows):
    w = _weight(gguf_tensors, name, rows)
    bias = torch.randn(w.rows) if rows else None
    lin = _linear(ops, w, bias)
    x = torch.randn(70, w.cols, generator=torch.Generator().manual_seed(0))
    results = {}
    for isa in ops.available_isas():
        ops.set_isa(isa)
        full = lin(x)
        # batch sizes on both sides of the small-M / dequantize-then-GEMM switch
        for m in (1, 3, 4, 5, 6, 13, 20, 32, 64):  # 20 and 32: row blocks of 5 (balanced_rows)
            assert torch.equal(lin(x[:m]), full[:m]), f"{isa}: rows of a batch of {m} differ from the batch of 70"
        assert torch.equal(torch.cat([lin(x[i : i + 1]) for i in range(0, 70, 7)]), full[::7])
        results[isa] = full
    first = next(iter(results.values()))
    assert all(torch.equal(first, r) for r in results.values()), "ISAs disagree"


def test_the_kernels_run_on_torchs_threads_with_the_same_results(ops, gguf_tensors):
    # A build without OpenMP is correct but serial (at::parallel_for then runs on the calling
    # thread): prefill took ~2x as long as oneDNN's on 2 cores. The team size is what OpenMP
    # was asked for, not a timing.
    before = torch.get_num_threads()
    w = _weight(gguf_tensors, "blk.0.ffn_gate.weight")
    lin = _linear(ops, w)
    x = torch.randn(70, w.cols, generator=torch.Generator().manual_seed(5))
    try:
        results = {}
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert ops.parallel_team(64) == threads
            results[threads] = (lin(x), lin(x[:1]), lin(x, fast=True))
        for threads in (2, 3):  # the split over output panels changes no output's sum
            assert all(torch.equal(a, b) for a, b in zip(results[1], results[threads]))
    finally:
        torch.set_num_threads(before)


def test_decode_batches_split_over_the_helper_pool_with_the_same_results(ops, gguf_tensors):
    # With the pool on at 32 rows (set_split_cut(32, ...)), calls of 32..64 rows
    # (a large decode batch) run on the helper pool, smaller ones on the calling thread; both
    # against 1 thread, at the cut and either side of it, linears and the paged attention. A cut
    # of 1 row sends even single rows through the pool.
    before, cut = torch.get_num_threads(), ops.split_cut()
    w = _weight(gguf_tensors, "blk.0.ffn_gate.weight")
    head = _weight(gguf_tensors, "token_embd.weight", 1000)
    lin, lin8 = _linear(ops, w), _linear(ops, head)
    x = torch.randn(64, w.cols, generator=torch.Generator().manual_seed(6))
    attn = _attention_case(ops, batch=48)
    chunks = ops.helper_chunks()
    ops.set_pool_guard(False)  # a loaded machine must not make the pool rest through this test
    try:
        results = {}
        for threads, min_rows in ((1, 32), (2, 32), (3, 32), (2, 1), (3, 1)):
            torch.set_num_threads(threads)
            ops.set_split_cut(min_rows, 0 if min_rows == 1 else 1 << 20)
            for _ in range(3):  # a helper may miss a call; over several it joins
                got = [lin(x[:m]) for m in (1, 8, 16, 31, 32, 33, 48, 64)]
                got += [lin(x[:40], fast=True), lin8(x[:32]), attn()]
            results[(threads, min_rows)] = got
        first = results[(1, 32)]
        for key, got in results.items():
            assert all(torch.equal(a, b) for a, b in zip(first, got)), f"threads, min_rows = {key}"
        assert ops.helper_chunks() > chunks, "no call ran on a helper"
        if sys.platform.startswith("linux"):  # the helpers name themselves for top -H and py-spy
            names = {(t / "comm").read_text().strip() for t in Path("/proc/self/task").iterdir()}
            assert {"sluice-helper1", "sluice-helper2"} <= names, names
    finally:
        ops.set_pool_guard(True)
        torch.set_num_threads(before)
        ops.set_split_cut(*cut)


def test_the_pool_rests_while_its_helpers_get_no_core(ops, gguf_tensors):
    # The guard (csrc/helper_pool.h tally): a window of split calls in which the helpers ran no
    # chunk (they had no core: here they are told to stay away, which is deterministic where a
    # busy core is not) makes the pool run the next calls serially, on the caller alone, for a
    # rest that doubles while the windows keep failing; results are the same bit for bit. Once
    # the helpers are back and the guard starts afresh, calls split on them again.
    window, first_rest, longest = ops.pool_guard_shape()
    assert window < first_rest < longest
    before, cut = torch.get_num_threads(), ops.split_cut()
    w = _weight(gguf_tensors, "blk.0.ffn_gate.weight")
    lin = _linear(ops, w)
    x = torch.randn(1, w.cols, generator=torch.Generator().manual_seed(7))
    torch.set_num_threads(1)
    expected = lin(x)
    try:
        torch.set_num_threads(2)
        ops.set_split_cut(1, 0)
        ops.set_helpers_away(True)
        ops.set_pool_guard(True)  # afresh: no rest, an empty window
        rested = ops.pool_rested_calls()
        calls = window + first_rest + window + 100
        for _ in range(calls):
            assert torch.equal(lin(x), expected)
        # window 1 fails -> first_rest calls serial -> window 2 fails -> a rest twice as long
        assert ops.pool_rested_calls() - rested == first_rest + 100
        ops.set_helpers_away(False)
        ops.set_pool_guard(True)
        chunks = ops.helper_chunks()
        for _ in range(20000):  # a helper joins a call only if it gets a core in time: over many, it does
            assert torch.equal(lin(x), expected)
            if ops.helper_chunks() > chunks:
                break
        assert ops.helper_chunks() > chunks, "no call ran on a helper after the rest"
    finally:
        ops.set_helpers_away(False)
        ops.set_pool_guard(True)
        torch.set_num_threads(before)
        ops.set_split_cut(*cut)


def test_one_stream_at_long_context_splits_its_attention_over_the_helper_pool(ops):
    # With decode_split_rows on (set_decode_split, the engine's default), decode attention splits
    # by work at any batch size (from ~28 context tokens of the bundled model): one stream's long
    # context runs on a second core when one is free, with the same result bit for bit. Off in the
    # extension until the engine sets it.
    from sluice.models.kernels import ATTN_SPLIT_MIN_WORK, set_decode_split

    before, cut, rows = torch.get_num_threads(), ops.attn_split_work(), ops.split_cut()
    single = _attention_case(ops, batch=1, lens=[1368])
    short = _attention_case(ops, batch=1, lens=[70])
    try:
        torch.set_num_threads(1)
        expected = single(), short()
        set_decode_split(32)
        assert ops.attn_split_work() == ATTN_SPLIT_MIN_WORK < 1368 * 9 * 64 * 2
        torch.set_num_threads(2)
        ops.set_pool_guard(False)  # a loaded machine must not make the pool rest through this test
        chunks = ops.helper_chunks()
        for i in range(2000):  # a helper joins a call only if it gets a core in time: over many, it does
            assert torch.equal(single(), expected[0]) and torch.equal(short(), expected[1])
            if i >= 10 and ops.helper_chunks() > chunks:
                break
        assert ops.helper_chunks() > chunks, "no call ran on a helper"
        ops.set_attn_split_work(0)  # every call splits, the short one too
        for _ in range(20):
            assert torch.equal(single(), expected[0]) and torch.equal(short(), expected[1])
    finally:
        ops.set_pool_guard(True)
        torch.set_num_threads(before)
        ops.set_attn_split_work(cut)
        ops.set_split_cut(*rows)


@pytest.mark.parametrize("name,rows", WEIGHTS[:2])
def test_exact_mode_is_as_accurate_as_an_fp32_matmul_and_fast_mode_is_close(ops, gguf_tensors, name, rows):
    w = _weight(gguf_tensors, name, rows)
    lin = _linear(ops, w)
    dense = w.dequantize()
    x = torch.randn(33, w.cols, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ dense.double().T
    exact_err = (lin(x).double() - ref).abs().max().item()
    fp32_err = ((x @ dense.T).double() - ref).abs().max().item()
    assert exact_err <= 2 * fp32_err + 1e-7, (exact_err, fp32_err)
    fast = lin(x, fast=True).double()
    rel = ((fast - ref).norm() / ref.norm()).item()
    assert 1e-4 < rel < 0.02, f"fast mode relative error {rel}"  # int8 activations: close, not exact


def _random_cache(kvh: int, blocks: int, bs: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(kvh, blocks * bs, d, generator=g), torch.randn(kvh, blocks * bs, d, generator=g)


def _attention_case(ops, batch: int, lens: list[int] | None = None):
    """A decode batch through KernelPagedAttention over scattered blocks, as a callable."""
    from sluice.models.kernels.paged_attention import KernelPagedAttention

    heads, kvh, d, bs = 9, 3, 64, 8
    g = torch.Generator().manual_seed(9)
    if lens is None:
        lens = torch.randint(1, 300, (batch,), generator=g).tolist()  # > 128: merged chunks too
    blocks = [-(-n // bs) for n in lens]
    k_cache, v_cache = _random_cache(kvh, sum(blocks) + 1, bs, d, seed=10)
    perm = (torch.randperm(sum(blocks), generator=g) + 1).tolist()
    tables, used = [], 0
    for nb in blocks:
        tables.append(perm[used : used + nb])
        used += nb
    width = max(blocks)
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        num_decodes=batch,
        block_size=bs,
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
    )
    q = torch.randn(batch, (heads + 2 * kvh) * d, generator=g)
    kernel = KernelPagedAttention(ops, heads, kvh, d, None)
    kernel.prepare(meta)
    return lambda: kernel.attend(q, k_cache, v_cache, meta)


@pytest.mark.parametrize("window", [None, 13, 200])
def test_paged_decode_attention_matches_the_torch_backend(ops, window):
    from sluice.models.kernels.paged_attention import KernelPagedAttention

    heads, kvh, d, bs = 9, 3, 64, 8
    k_cache, v_cache = _random_cache(kvh, 128, bs, d, seed=2)
    lens = [1, 7, 8, 9, 40, 300, 3, 129]  # 300 and 129: several 128-position chunks, merged
    g = torch.Generator().manual_seed(3)
    perm = torch.randperm(127, generator=g) + 1  # scattered blocks, never the null block 0
    tables, used = [], 0
    for n in lens:
        nb = -(-n // bs)
        tables.append(perm[used : used + nb].tolist())
        used += nb
    width = max(map(len, tables))
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        num_decodes=len(lens),
        block_size=bs,
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
    )
    q = torch.randn(len(lens), (heads + 2 * kvh) * d, generator=g)  # q rows inside fused qkv rows
    ref_backend = TorchPagedAttention(heads, kvh, d, window)
    ref_backend.prepare(meta)
    ref = ref_backend.attend(q, k_cache, v_cache, meta)
    kernel = KernelPagedAttention(ops, heads, kvh, d, window)
    kernel.prepare(meta)
    results = {}
    for isa in ops.available_isas():
        ops.set_isa(isa)
        results[isa] = kernel.attend(q, k_cache, v_cache, meta)
        torch.testing.assert_close(results[isa], ref, rtol=1e-5, atol=1e-5)
    first = next(iter(results.values()))
    assert all(torch.equal(first, r) for r in results.values())


@pytest.mark.parametrize("window", [None, 13])
@pytest.mark.parametrize("long_context", [False, True])
def test_prefill_rows_through_the_decode_kernel_match_sdpa(ops, window, long_context):
    # A step of two decodes and three prefill chunks (one from position 0, two after a cached
    # prefix). Short contexts go through paged_decode row by row, a long one keeps SDPA.
    from sluice.models.attention import PrefillSpan
    from sluice.models.kernels.paged_attention import PAGED_PREFILL_MAX_CONTEXT, KernelPagedAttention

    heads, kvh, d, bs = 9, 3, 64, 8
    k_cache, v_cache = _random_cache(kvh, 128, bs, d, seed=6)
    g = torch.Generator().manual_seed(7)
    perm = (torch.randperm(127, generator=g) + 1).tolist()
    chunks = [(0, 17), (24, 40), (5, 6)]  # (cached tokens, context after the chunk)
    if long_context:
        chunks.append((PAGED_PREFILL_MAX_CONTEXT - 3, PAGED_PREFILL_MAX_CONTEXT + 20))
    decode_lens = [9, 30]
    used, tables = 0, []
    for n in decode_lens + [c for _, c in chunks]:
        nb = -(-n // bs)
        tables.append(perm[used : used + nb])
        used += nb
    width = max(len(t) for t in tables[:2])
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        num_decodes=2,
        block_size=bs,
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables[:2]], dtype=torch.int32),
        context_lens=torch.tensor(decode_lens, dtype=torch.int32),
    )
    row = 2
    for (cached, ctx), blocks in zip(chunks, tables[2:]):
        slots = torch.tensor([blocks[p // bs] * bs + p % bs for p in range(ctx)])
        mask = None
        if cached or (window and ctx > window):
            q_pos = torch.arange(cached, ctx)[:, None]
            k_pos = torch.arange(ctx)[None, :]
            mask = k_pos <= q_pos
            if window:
                mask &= k_pos > q_pos - window
        meta.prefills.append(PrefillSpan(row, row + ctx - cached, slots, mask))
        row += ctx - cached
    q = torch.randn(row, (heads + 2 * kvh) * d, generator=g)
    ref_backend = TorchPagedAttention(heads, kvh, d, window)
    ref_backend.prepare(meta)
    ref = ref_backend.attend(q, k_cache, v_cache, meta)
    kernel = KernelPagedAttention(ops, heads, kvh, d, window)
    kernel.prepare(meta)
    assert (meta.derived is None) == long_context  # one call for all rows only when all are short
    torch.testing.assert_close(kernel.attend(q, k_cache, v_cache, meta), ref, rtol=1e-5, atol=1e-5)


def test_fused_norm_silu_and_rope_match_the_torch_ops(ops):
    from sluice.models.rope import RotaryTable

    g = torch.Generator().manual_seed(4)
    h = torch.randn(5, 576, generator=g)
    delta = torch.randn(5, 576, generator=g)
    w = torch.randn(576, generator=g)
    expected_h = h + delta
    var = expected_h.pow(2).mean(-1, keepdim=True)
    expected = w * (expected_h * torch.rsqrt(var + 1e-5))
    got = ops.add_rms_norm(h, delta, w, 1e-5)
    assert torch.equal(h, expected_h)  # the residual add happens in place
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)

    gu = torch.randn(3, 2 * 1536, generator=g) * 4
    torch.testing.assert_close(
        ops.silu_mul(gu), torch.nn.functional.silu(gu[:, :1536]) * gu[:, 1536:], rtol=2e-6, atol=1e-6
    )

    heads, kvh, d = 9, 3, 64
    rope = RotaryTable(d, 256, 10000.0, None)
    qkv = torch.randn(4, (heads + 2 * kvh) * d, generator=g)
    positions = torch.tensor([0, 5, 77, 255])
    slots = torch.tensor([3, 9, 10, 31])
    k_cache, v_cache = torch.zeros(kvh, 32, d), torch.zeros(kvh, 32, d)
    cos, sin = rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1)
    q_ref = rope.apply(qkv[:, : heads * d].view(4, heads, d), cos, sin)
    k_ref = rope.apply(qkv[:, heads * d : (heads + kvh) * d].view(4, kvh, d), cos, sin)
    v_ref = qkv[:, (heads + kvh) * d :].view(4, kvh, d).clone()
    ops.rope_and_cache(qkv, positions, rope.cos, rope.sin, slots, k_cache, v_cache, heads, kvh, d)
    assert torch.equal(qkv[:, : heads * d].view(4, heads, d), q_ref)  # bit for bit: same products and sums
    assert torch.equal(k_cache[:, slots].transpose(0, 1), k_ref)
    assert torch.equal(v_cache[:, slots].transpose(0, 1), v_ref)


def test_the_16_bit_cache_is_the_fp32_cache_rounded_once(ops):
    # The opt-in float16 K/V cache (kv_cache_dtype): rope_and_cache rounds each K/V value to fp16
    # once, and the attention widens it back exactly, so a 16-bit cache gives bit for bit what
    # the fp32 kernel gives on the rounded values, on every ISA; the torch backend agrees.
    from sluice.models.kernels.paged_attention import KernelPagedAttention
    from sluice.models.rope import RotaryTable

    heads, kvh, d, bs = 9, 3, 64, 8
    g = torch.Generator().manual_seed(11)
    rope = RotaryTable(d, 512, 10000.0, None)
    lens = [1, 9, 300]
    qkv = torch.randn(sum(lens), (heads + 2 * kvh) * d, generator=g)
    positions = torch.cat([torch.arange(n) for n in lens])
    blocks = [-(-n // bs) for n in lens]
    perm = (torch.randperm(sum(blocks), generator=g) + 1).tolist()
    tables, used = [], 0
    for nb in blocks:
        tables.append(perm[used : used + nb])
        used += nb
    slots = torch.tensor([tables[i][p // bs] * bs + p % bs for i, n in enumerate(lens) for p in range(n)])
    num_slots = (sum(blocks) + 1) * bs
    k32, v32 = torch.zeros(kvh, num_slots, d), torch.zeros(kvh, num_slots, d)
    k16, v16 = torch.zeros(kvh, num_slots, d, dtype=torch.half), torch.zeros(kvh, num_slots, d, dtype=torch.half)
    ops.rope_and_cache(qkv.clone(), positions, rope.cos, rope.sin, slots, k32, v32, heads, kvh, d)
    ops.rope_and_cache(qkv, positions, rope.cos, rope.sin, slots, k16, v16, heads, kvh, d)
    assert torch.equal(k16, k32.half()) and torch.equal(v16, v32.half())  # round to nearest even, once
    width = max(blocks)
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        num_decodes=len(lens),
        block_size=bs,
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
    )
    q = qkv[torch.tensor(lens).cumsum(0) - 1]  # each sequence's last position decodes
    kernel = KernelPagedAttention(ops, heads, kvh, d, None)
    kernel.prepare(meta)
    expected = kernel.attend(q, k16.float(), v16.float(), meta)
    for isa in ops.available_isas():
        ops.set_isa(isa)
        assert torch.equal(kernel.attend(q, k16, v16, meta), expected)
    ref_backend = TorchPagedAttention(heads, kvh, d, None)
    ref_backend.prepare(meta)
    torch.testing.assert_close(ref_backend.attend(q, k16, v16, meta), expected, rtol=1e-5, atol=1e-5)


def test_bundled_model_keeps_its_weights_quantized(ops, bundled, bundled_torch):
    from sluice.models.loader import default_model_path

    size = default_model_path().stat().st_size
    assert bundled.model.uses_kernels
    assert 0.9 * size < bundled.model.weight_bytes() < 1.05 * size  # about the GGUF file
    assert not bundled_torch.model.uses_kernels
    assert bundled_torch.model.weight_bytes() > 5 * size  # fp32, dequantized at load


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0]


def _huge_kib_under(start: int, end: int) -> int:
    """AnonHugePages of this process's mappings that overlap [start, end), from /proc/self/smaps."""
    kib, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "AnonHugePages:":
            kib += int(line.split()[1])
    return kib


def test_the_packed_weights_share_one_region_on_huge_pages(ops, bundled):
    """models/kernels/weight_region.py: every packed weight is a 64-byte-aligned view into one
    region starting on a 2 MiB boundary, which gets huge pages wherever THP is not `never`."""
    from sluice.models.kernels.packed_linear import PackedLinear
    from sluice.models.kernels.weight_region import HUGE_PAGE

    model = bundled.model
    packed = list({id(x): x for x in model.linears() if isinstance(x, PackedLinear)}.values())
    assert len(packed) == 1 + 4 * len(model.layers)
    storages = {lin.packed.untyped_storage().data_ptr() for lin in packed}
    assert len(storages) == 1, "the packed weights are not in one region"
    ptrs = sorted((lin.packed.data_ptr(), lin.packed.numel()) for lin in packed)
    assert all(p % 64 == 0 and n > 0 for p, n in ptrs)
    assert ptrs[0][0] % HUGE_PAGE == 0
    assert all(a + n <= b for (a, n), (b, _) in zip(ptrs, ptrs[1:])), "views overlap"
    start, end = ptrs[0][0], ptrs[-1][0] + ptrs[-1][1]
    if _thp_mode() in ("always", "madvise"):
        # most of the ~96 MB; a busy host may not have every huge page free at load time
        assert _huge_kib_under(start, end) * 1024 >= (end - start) // 2


def test_a_failed_build_falls_back_to_torch_with_one_log_line(monkeypatch, caplog):
    import sluice.models.kernels as kernels
    from sluice.models.kernels import build

    def broken(verbose: bool = False):
        raise RuntimeError("compiling isa_avx2.o failed: no compiler")

    monkeypatch.setattr(build, "load_module", broken)
    with caplog.at_level(logging.INFO, logger="sluice.models.kernels"):
        assert kernels._load() is None
    lines = [r for r in caplog.records if r.name == "sluice.models.kernels"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "using the torch path" in lines[0].getMessage() and "no compiler" in lines[0].getMessage()
    assert kernel_ops(KernelChoice.TORCH) is None
