"""Random-init Llama configurations by name (`--model random:<preset>`): for the parallelism
tests and benchmarks at sizes the bundled model lacks. The vocabulary is the tokenizer's."""

from __future__ import annotations

from typing import Any

from sluice.models.config import HF_SHAPE

# each preset's shape in HF_SHAPE's order (the vocabulary is the tokenizer's); head_dim = hidden / heads
_SHAPES = {
    # the tests' model: two layers, a few hundred thousand parameters besides the embeddings
    "tiny": (64, 160, 2, 4, 2, 2048),
    # SmolLM2-135M's shape (30 layers, 576 wide, GQA 9/3)
    "smol-135m": (576, 1536, 30, 9, 3, 8192),
    # a ~1B Llama (Llama 3.2 1B's shape) for GPU throughput / MFU measurements
    "llama-1b": (2048, 8192, 16, 32, 8, 8192),
}
PRESETS: dict[str, dict[str, Any]] = {name: dict(zip(HF_SHAPE, shape, strict=True)) for name, shape in _SHAPES.items()}
