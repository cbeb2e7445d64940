"""Random-init Llama configurations by name (`--model random:<preset>`): for the parallelism
tests and benchmarks at sizes the bundled model lacks. The vocabulary is the tokenizer's."""

from __future__ import annotations

from typing import Any

# LlamaConfig fields besides vocab_size; head_dim = hidden / heads.
PRESETS: dict[str, dict[str, Any]] = {
    # the tests' model: two layers, a few hundred thousand parameters besides the embeddings
    "tiny": dict(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    ),
    # SmolLM2-135M's shape (30 layers, 576 wide, GQA 9/3)
    "smol-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
    ),
    # a ~1B Llama (Llama 3.2 1B's shape) for GPU throughput / MFU measurements
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
    ),
}
