"""Tiny random Llama / Qwen2 / Mistral folders, written by the tests themselves (no hub).

Weights are drawn with a larger spread than transformers' default init (std 0.02 gives nearly
uniform logits, where greedy decoding is a coin toss between near-ties); a byte-level tokenizer
with ChatML special tokens makes the folder loadable like any real model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 256 + len(SPECIAL)


def _tokenizer_json(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False})
    )


def _rope(theta: float) -> dict[str, Any]:
    """Plain RoPE of base `theta`, in transformers 5's spelling of it."""
    return {"rope_type": "default", "rope_theta": theta}


def write_tiny_model(path: Path, arch: str, seed: int = 0) -> Path:
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        eos_token_id=2,
        bos_token_id=1,
    )
    model: transformers.PreTrainedModel
    torch.manual_seed(seed)  # the model's own initialisation and the draws below come from the seed
    if arch == "llama":
        llama = transformers.LlamaConfig(**common, rope_parameters=_rope(10000.0), tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(llama)
    elif arch == "qwen2":
        qwen2 = transformers.Qwen2Config(**common, rope_parameters=_rope(1000000.0), tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(qwen2)
    elif arch == "mistral":
        # a small sliding window so that tests cross it
        mistral = transformers.MistralConfig(
            **common, rope_parameters=_rope(10000.0), sliding_window=24, tie_word_embeddings=False
        )
        model = transformers.MistralForCausalLM(mistral)
    else:
        raise ValueError(arch)
    model = model.eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.8, 1.2)
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    _tokenizer_json(path)
    return path
