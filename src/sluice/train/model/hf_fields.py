"""transformers' config fields that copy a sluice ModelConfig attribute as it is, by name.

The reverse of ModelConfig.from_hf_dict's reading: model/build.py writes a transformers config
from a ModelConfig (a GGUF's), parallel/fit.py reads the shape it checks in transformers' names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.models.config import ModelConfig

# transformers' name -> ModelConfig's
HF_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "max_position_embeddings": "max_position",
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "tie_word_embeddings": "tie_word_embeddings",
    "bos_token_id": "bos_token_id",
    "sliding_window": "sliding_window",
}


def hf_values(cfg: ModelConfig, names: tuple[str, ...]) -> dict[str, Any]:
    """`cfg`'s values of the transformers fields `names`."""
    return {name: getattr(cfg, HF_FIELDS[name]) for name in names}
