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
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.gguf_tokenizer import build_bpe_tokenizer, transformers_tokenizer
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


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError... on bad files
        raise ModelLoadError(f"{path} is not a valid GGUF file ({type(exc).__name__}: {exc})") from None


def _metadata(reader: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # unknown field encodings are not needed to run the model
            continue
    return meta


def _config(meta: dict[str, Any], has_output: bool, name: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; sluice loads llama and qwen2 GGUF files")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length") or hidden // heads),
        max_position=int(get("context_length")),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        attention_bias=arch == "qwen2",
        tie_word_embeddings=not has_output,
        sliding_window=meta.get(f"{arch}.attention.sliding_window"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[int(eos)] if eos is not None else [],
        name=name,
    )


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
    reader = _open(path)
    meta = _metadata(reader)
    names = {t.name for t in reader.tensors}
    config = _config(meta, "output.weight" in names, name=path.stem)
    weights: dict[str, Weight] = {}
    for i, tensor in enumerate(reader.tensors):
        hf = _hf_name(tensor.name)
        if hf is None:
            continue  # e.g. rope_freqs: derived from the config instead
        heads = None
        if config.architecture == "llama" and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_heads if "attn_q" in tensor.name else config.num_kv_heads
        kind = tensor.tensor_type.name
        if keep_quantized and kind in QuantType.__members__ and len(tensor.shape) == 2:
            rows, cols = int(tensor.shape[1]), int(tensor.shape[0])
            q = QuantizedWeight.from_blocks(QuantType(kind), rows, cols, tensor.data)
            weights[hf] = q if heads is None else QuantizedWeight(q.qtype, rows, cols, _unpermute(q.data, heads))
        else:
            weights[hf] = _dequantize(tensor, heads, dtype)
        if progress:
            progress(i + 1, len(reader.tensors))
    tokenizer = _tokenizer(meta, path)
    return config, weights, tokenizer


def _dequantize(tensor: Any, heads: int | None, dtype: torch.dtype) -> torch.Tensor:
    from gguf.quants import dequantize

    try:
        array = dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:
        raise ModelLoadError(f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}): {exc}") from None
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    array = array.reshape(shape)
    if heads is not None:
        array = _unpermute(array, heads)
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True)).to(dtype)


def _tokenizer(meta: dict[str, Any], path: Path) -> Tokenizer:
    backend = build_bpe_tokenizer(meta) or transformers_tokenizer(path)
    tokens = meta.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str | None:
        idx = meta.get(key)
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    eos = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)] if eos is not None else []
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos_ids:
        eos_ids.append(int(eot))
    return Tokenizer(
        backend=backend,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        eos_token_ids=eos_ids,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )
