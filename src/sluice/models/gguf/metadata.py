"""What a GGUF file's metadata says: the model's architecture (ModelConfig) and its tokenizer.

No torch here (numpy and tokenizers only): the gateway reads each version's tokenizer through
this module (models/tokenizer_loader.py) and must not pay for importing torch; the weight
loader (gguf/loader.py) reads the same metadata the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.gguf.file import GgufFile, read_gguf
from sluice.models.gguf.tokenizer import build_bpe_tokenizer, transformers_tokenizer
from sluice.models.tokenizer import Tokenizer


def open_gguf(path: Path) -> GgufFile:
    """The parsed file; any malformation is one ModelLoadError naming the file."""
    try:
        return read_gguf(path)
    except Exception as exc:  # GgufFormatError, OSError, struct/numpy errors on odd files
        raise ModelLoadError(f"{path} is not a valid GGUF file ({type(exc).__name__}: {exc})") from None


def model_config(meta: dict[str, Any], has_output: bool, name: str) -> ModelConfig:
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


def file_config(gguf: GgufFile) -> ModelConfig:
    return model_config(gguf.metadata, gguf.has_tensor("output.weight"), name=gguf.path.stem)


def tokenizer(meta: dict[str, Any], path: Path) -> Tokenizer:
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
