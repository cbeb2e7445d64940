"""The architecture description every loader produces and the forward pass consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.errors import ModelLoadError

# Hugging Face `model_type` / GGUF `general.architecture` values we run with one forward.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")

# The `config.json` fields (transformers' LlamaConfig names) that fix a model's shape besides its
# vocabulary, in the order the shape tables give them: random_init.py's shapes, the training
# presets (train/model/presets.py) and the Mixtral config of an upcycled model (train/model/moe.py).
HF_SHAPE = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2 puts a bias on q/k/v
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = "model"

    def validate(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; sluice runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], name: str = "model") -> ModelConfig:
        """Build from a Hugging Face `config.json` dictionary."""
        try:
            arch = cfg.get("model_type", "")
            num_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            eos = cfg.get("eos_token_id")
            eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
            rope_scaling = cfg.get("rope_scaling")
            rope_theta = cfg.get("rope_theta")
            # transformers 5 moved theta (and scaling) into `rope_parameters`.
            params = cfg.get("rope_parameters")
            if isinstance(params, dict):
                rope_theta = params.get("rope_theta", rope_theta)
                if params.get("rope_type", "default") != "default":
                    rope_scaling = params
            window = cfg.get("sliding_window") if cfg.get("use_sliding_window", arch == "mistral") else None
            config = cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=int(cfg.get("head_dim") or hidden // num_heads),
                max_position=int(cfg.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
                rope_scaling=rope_scaling,
                attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                sliding_window=int(window) if window else None,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=[int(e) for e in eos_ids],
                name=name,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"config.json is missing or has a bad value for {exc}") from None
        config.validate()
        return config
