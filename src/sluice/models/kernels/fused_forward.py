"""The decoder forward on the CPU kernels: the same function as LlamaModel's torch forward,
in ~9 extension calls per layer instead of ~80 torch ops.

Per layer: RMSNorm fused with the residual add (h += delta, then normalize), the fused qkv
linear, RoPE of q and k fused with the K/V cache write (in place in the qkv rows), attention
(decodes in place through the block tables), the o linear, the second RMSNorm + residual, the
fused gate/up linear, SiLU·mul, the down linear. At batch 1 the torch path spent 11-15 ms per
token on dispatching its ~2,400 ops (no-op casts, views, separate q/k RoPE, norms); this path
has no casts or views left to dispatch.

When one paged_decode call attends every row (every decode step, and steps whose prefill chunks
are short), the layers run inside the extension instead (`ops.DecoderStack`, csrc/decoder_stack.h):
the same calls in the same order, made from C++, so the same bits without the ~270 Python-level
calls and GIL hand-offs per step. Steps with a long prefill chunk keep the loop below, whose
attention goes through SDPA for that chunk.
"""

from __future__ import annotations

from typing import Any

import torch

from sluice.models.attention import AttentionMetadata
from sluice.models.kernels.paged_attention import KernelPagedAttention
from sluice.models.lora.batch import LoraBatch, apply_native
from sluice.models.lora.weights import Module


def build_decoder_stack(model: Any) -> Any | None:
    """The extension's DecoderStack over the model's layers, or None when a layer's linear is
    not a PackedLinear (weights not in Q4_1 / Q8_0 blocks) or the attention is not the kernel's."""
    from sluice.models.kernels.packed_linear import PackedLinear
    from sluice.models.quantized import QuantType

    ops, cfg, attention = model.ops, model.config, model.attention
    if ops is None or not isinstance(attention, KernelPagedAttention):
        return None
    names = ("qkv", "o", "gate_up", "down")
    if not all(isinstance(getattr(layer, n), PackedLinear) for layer in model.layers for n in names):
        return None
    stack = ops.DecoderStack(
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        attention.scale,
        attention.window,
        model.rope_cos,
        model.rope_sin,
    )
    for layer in model.layers:
        lins = [getattr(layer, n) for n in names]
        stack.add_layer(
            layer.input_norm,
            layer.post_norm,
            [x.packed for x in lins],
            [x.bias for x in lins],
            [x.out_features for x in lins],
            [x.in_features for x in lins],
            [x.qtype is QuantType.Q4_1 for x in lins],
        )
    return stack


def fused_forward(
    model: Any,  # the LlamaModel (models/llama.py) that calls this: it imports this module, not back
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    meta: AttentionMetadata,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    logits_indices: torch.Tensor,
    fast: bool,
    argmax_rows: torch.Tensor | None = None,
    lora: LoraBatch | None = None,
) -> torch.Tensor:
    """`lora`: each row's adapter; its low-rank products follow every linear (csrc/lora.h)."""
    ops = model.ops
    assert ops is not None
    cfg = model.config
    eps = cfg.rms_norm_eps
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    cos, sin = model.rope_cos, model.rope_sin
    attention = model.attention
    # a decode-sized step (never on OpenMP): the helper pool's idle helpers spin through it instead
    # of sleeping between its ~150-300 split calls
    hot = input_ids.shape[0] <= ops.DECODE_MAX_ROWS
    if hot:
        ops.set_pool_hot(True)
    try:
        h = model.embed_rows(input_ids)  # [T, hidden], updated in place by the residual adds
        delta = None
        # the stack serves the attention it was built with (a test may swap in another backend)
        use_stack = model.stack is not None and isinstance(attention, KernelPagedAttention)
        tables = attention.one_call_tables(meta) if use_stack else None
        if tables is not None:
            delta = model.stack.forward(
                h,
                positions,
                meta.slot_mapping,
                kv_caches,
                tables[0],
                tables[1],
                meta.block_size,
                fast,
                None if lora is None else lora.native,
            )
        else:
            for i, (layer, (k_cache, v_cache)) in enumerate(zip(model.layers, kv_caches)):
                x = ops.add_rms_norm(h, delta, layer.input_norm, eps)
                qkv = layer.qkv(x, fast)
                apply_native(ops, lora, qkv, x, i, Module.QKV)
                ops.rope_and_cache(
                    qkv, positions, cos, sin, meta.slot_mapping, k_cache, v_cache, heads, kv_heads, head_dim
                )
                attn = attention.attend(qkv, k_cache, v_cache, meta)
                o = layer.o(attn, fast)
                apply_native(ops, lora, o, attn, i, Module.O_PROJ)
                x = ops.add_rms_norm(h, o, layer.post_norm, eps)
                gate_up = layer.gate_up(x, fast)
                apply_native(ops, lora, gate_up, x, i, Module.GATE_UP)
                act = ops.silu_mul(gate_up)
                delta = layer.down(act, fast)
                apply_native(ops, lora, delta, act, i, Module.DOWN)
        # only the rows whose logits are sampled need the last residual, norm and LM head. Gathered
        # with index_select, not h[logits_indices]: advanced indexing runs an OpenMP region even at
        # 32 rows, whose thread then spins on the second core for milliseconds after it, against the
        # helper running half of the LM head (a 32-row head 16.6 instead of 12.2 ms in the step;
        # docs/BENCHMARKS.md, "No OpenMP in a decode step").
        rows = h.index_select(0, logits_indices)
        x = ops.add_rms_norm(rows, None if delta is None else delta.index_select(0, logits_indices), model.norm, eps)
        if argmax_rows is not None and hasattr(model.lm_head, "argmax_logits"):
            return model.lm_head.argmax_logits(x, argmax_rows)
        return model.lm_head(x)
    finally:
        if hot:
            ops.set_pool_hot(False)
