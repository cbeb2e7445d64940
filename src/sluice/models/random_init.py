"""Random-initialised Llama models of named shapes: weights drawn from a seed, on the target device.

For the GPU checks and benchmarks on machines no checkpoint can reach (the bundled GGUF does not
travel to a lent GPU machine): the same seed on the same kind of device gives the same weights,
so sluice and a transformers model built from the same state dict compute the same function.
The weights are drawn in fp32 and then cast, so a bfloat16 model is the fp32 one rounded: its
reference is the fp32 model of the same seed.

`SHAPES` holds Hugging Face `config.json` dictionaries: `small` has the bundled
SmolLM2-135M-Instruct's shapes, `1b` Llama-3.2-1B's (context capped at 16,384, twice its RoPE
scaling's original length, so the engine's default pool stays small), `tiny` a CPU-sized test
model. Each weight matrix is drawn with std 1/sqrt(fan_in) (norm weights uniform in [0.8, 1.2]):
activations keep unit scale through the layers and the logits spread by about one unit, so greedy
picks are rarely near-ties (transformers' default std 0.02 would give nearly uniform logits).

The tokenizer is synthetic (word `t<i>` for id i, no merges): prompts are lists of ids and outputs
are compared as ids; only its size and end-of-sequence id matter.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sluice.models.config import HF_SHAPE, ModelConfig
from sluice.models.device import resolve_device
from sluice.models.llama import LlamaModel
from sluice.models.loader import DTYPES, LoadedModel
from sluice.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import transformers

EOS_ID = 0


_HF_KEYS = ("vocab_size", *HF_SHAPE, "rope_theta", "rms_norm_eps", "tie_word_embeddings")


def _llama(sizes: tuple[int | float | bool, ...], **rest: Any) -> dict[str, Any]:
    """A Llama `config.json`: `sizes` in _HF_KEYS' order, `rest` any further keys by their HF names."""
    return dict(model_type="llama", **dict(zip(_HF_KEYS, sizes, strict=True)), **rest)


# vocab, hidden, intermediate, layers, heads, kv heads, context, rope theta, RMS eps, tied embeddings
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": _llama((512, 64, 160, 3, 4, 2, 1024, 10000.0, 1e-6, False)),
    "small": _llama((49152, 576, 1536, 30, 9, 3, 8192, 100000.0, 1e-5, True)),  # SmolLM2-135M(-Instruct)
    "1b": _llama(  # Llama-3.2-1B
        (128256, 2048, 8192, 16, 32, 8, 16384, 500000.0, 1e-5, True),
        head_dim=64,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
}


def hf_config(shape: str | dict[str, Any]) -> dict[str, Any]:
    """The `config.json` dictionary of a named shape (or a copy of the one given)."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown random-init shape {shape!r}; choose one of {', '.join(SHAPES)}")
        shape = SHAPES[shape]
    cfg = copy.deepcopy(shape)
    cfg.setdefault("eos_token_id", EOS_ID)
    cfg.setdefault("bos_token_id", None)
    return cfg


def random_state_dict(
    shape: str | dict[str, Any], seed: int = 0, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Hugging Face-named weights drawn on `device` from `seed` (fp32 draws, then cast)."""
    cfg = hf_config(shape)
    target = resolve_device(device) if isinstance(device, str) else device
    out_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    gen = torch.Generator(device=target).manual_seed(seed)
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads

    def normal(rows: int, cols: int) -> torch.Tensor:
        w = torch.empty(rows, cols, device=target, dtype=torch.float32)
        return w.normal_(0.0, 1.0 / math.sqrt(cols), generator=gen).to(out_dtype)

    def norm(n: int) -> torch.Tensor:
        return torch.empty(n, device=target, dtype=torch.float32).uniform_(0.8, 1.2, generator=gen).to(out_dtype)

    state = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = norm(hidden)
        state[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        state[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        state[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        state[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        state[p + "post_attention_layernorm.weight"] = norm(hidden)
        state[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        state[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        state[p + "mlp.down_proj.weight"] = normal(hidden, inter)
    state["model.norm.weight"] = norm(hidden)
    if not cfg.get("tie_word_embeddings", False):
        state["lm_head.weight"] = normal(vocab, hidden)
    return state


def synthetic_tokenizer(vocab_size: int, eos_id: int = EOS_ID) -> Tokenizer:
    """One word per id (`t<i>`), whitespace-separated: decodes any id, merges nothing."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    backend = Backend(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token=f"t{eos_id}"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend=backend, eos_token=f"t{eos_id}", eos_token_ids=[eos_id])


def load_random_model(
    shape: str | dict[str, Any],
    seed: int = 0,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    state: dict[str, torch.Tensor] | None = None,
) -> LoadedModel:
    """A LoadedModel of `shape` with weights from `seed` (or the given `state`), on the portable
    torch path (no CPU kernels: the GPU's path, and what a CPU test of it should run)."""
    cfg = hf_config(shape)
    target = resolve_device(device) if isinstance(device, str) else device
    if state is None:
        state = random_state_dict(cfg, seed, dtype, target)
    name = shape if isinstance(shape, str) else "custom"
    config = ModelConfig.from_hf_dict(cfg, name=f"random-{name}")
    model = LlamaModel(config, state, device=target)
    return LoadedModel(
        config=config,
        model=model,
        tokenizer=synthetic_tokenizer(config.vocab_size),
        path=Path(f"random-init:{name}:seed{seed}"),
    )


def hf_model(
    shape: str | dict[str, Any],
    state: dict[str, torch.Tensor],
    dtype: str = "float32",
    device: str | torch.device = "cpu",
) -> transformers.LlamaForCausalLM:
    """transformers' LlamaForCausalLM of the same shape with the same weights, in eval mode.

    transformers is a test / benchmark dependency, imported here only."""
    import transformers

    cfg = hf_config(shape)
    target = resolve_device(device) if isinstance(device, str) else device
    config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device(target):
        model = transformers.LlamaForCausalLM(config)
    # on `target` even if built elsewhere; transformers' decorator on `to` hides its signature from mypy
    model = model.to(device=target, dtype=DTYPES[dtype]).eval()  # type: ignore[call-arg]
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.get("tie_word_embeddings") else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"state dict does not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()
    return model
