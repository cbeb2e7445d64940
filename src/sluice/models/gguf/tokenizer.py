"""Build a fast `tokenizers` BPE tokenizer straight from a GGUF file's metadata.

transformers can convert GGUF tokenizers too, but its Python converter takes ~6 s for a 49k
vocabulary; building the Rust tokenizer directly takes a fraction of a second. The
pre-tokenizer follows llama.cpp's `tokenizer.ggml.pre` (for `smollm`, digits split one by one,
as in the model's original tokenizer.json). Vocabularies we do not build ourselves fall back to
transformers' converter, which handles every GGUF tokenizer it knows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

# llama.cpp token types
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str) -> Any | None:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    regex = {"llama-bpe": _LLAMA3_REGEX, "llama3": _LLAMA3_REGEX, "qwen2": _QWEN2_REGEX}.get(pre)
    if regex is None:
        return None
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_bpe_tokenizer(meta: dict[str, Any]) -> tokenizers.Tokenizer | None:
    """A tokenizer for GGUF metadata `meta`, or None if this vocabulary type is not built here."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        return None
    pre = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    if pre is None:
        return None
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    added = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    backend.add_special_tokens(special)
    if added:
        backend.add_tokens(added)
    return backend


def transformers_tokenizer(path: Path) -> tokenizers.Tokenizer:
    """transformers' own GGUF conversion: slow, but covers SentencePiece and other vocabularies."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return tok.backend_tokenizer
