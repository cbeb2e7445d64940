"""Load a GGUF checkpoint: architecture from its metadata, weights kept quantized or dequantized.

With `keep_quantized` (the CPU kernels run), Q4_1 and Q8_0 tensors stay in their GGUF blocks
(`QuantizedWeight`: the model's memory is then about the file's size); every other tensor, and
all of them otherwise, is dequantized with the `gguf` package's reference implementation (for
Q4_1: w = d·q + m per 32-value block), so our fp32 weights are bit-identical to what
transformers loads from the same file. llama.cpp's converter permutes the q/k rows of
Llama-architecture models for its RoPE layout; we undo that permutation, as transformers does
(on whole rows, so it works on the blocks too).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.gguf.file import GgufTensor
from sluice.models.gguf.metadata import file_config, open_gguf, tokenizer
from sluice.models.quantized import QuantizedWeight, QuantType, Weight
from sluice.models.tokenizer import Tokenizer

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")

Progress = Callable[[int, int], None]  # (done, total)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation (transformers' reverse_permute_weights)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def load_gguf(
    path: Path, dtype: torch.dtype = torch.float32, progress: Progress | None = None, keep_quantized: bool = False
) -> tuple[ModelConfig, dict[str, Weight], Tokenizer]:
    """Read config, weights and tokenizer from one GGUF file.

    `progress(done, total)` is called after each tensor.
    """
    gguf = open_gguf(path)
    config = file_config(gguf)
    weights: dict[str, Weight] = {}
    for i, tensor in enumerate(gguf.tensors):
        hf = _hf_name(tensor.name)
        if hf is None:
            continue  # e.g. rope_freqs: derived from the config instead
        heads = None
        if config.architecture == "llama" and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_heads if "attn_q" in tensor.name else config.num_kv_heads
        kind = tensor.type_name
        if keep_quantized and kind in QuantType.__members__ and len(tensor.dims) == 2:
            rows, cols = tensor.dims[1], tensor.dims[0]
            # the blocks stay a view of the (private) mapping: the model's packing copies them
            q = QuantizedWeight.from_blocks(QuantType(kind), rows, cols, tensor.data)
            weights[hf] = q if heads is None else QuantizedWeight(q.qtype, rows, cols, _unpermute(q.data, heads))
        else:
            weights[hf] = _dequantize(tensor, heads, dtype)
        if progress:
            progress(i + 1, len(gguf.tensors))
    return config, weights, tokenizer(gguf.metadata, path)


def _dequantize(tensor: GgufTensor, heads: int | None, dtype: torch.dtype) -> torch.Tensor:
    if tensor.type_name == "F32":  # what gguf's dequantize does for F32: the values as stored
        array = tensor.data
    else:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        try:
            array = dequantize(tensor.data, GGMLQuantizationType(tensor.type_id))
        except Exception as exc:
            raise ModelLoadError(f"cannot dequantize {tensor.name} ({tensor.type_name}): {exc}") from None
    array = array.reshape(tensor.shape)
    if heads is not None:
        array = _unpermute(array, heads)
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True)).to(dtype)
