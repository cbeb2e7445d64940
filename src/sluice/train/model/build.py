"""The trainable module: transformers' own CausalLM classes, filled with the weights sluice loads.

transformers' LlamaForCausalLM (and its Qwen2 / Mistral siblings) is the reference sluice's
serving forward is tested against, is kept up to date by its maintainers, and composes with
DDP, FSDP2 and DTensor; writing a second training forward here would add a third copy of the
architecture. What sluice adds is the weights: the bundled SmolLM2 GGUF is read by sluice's
GGUF loader (dequantized to fp32, q/k rows un-permuted, names already in Hugging Face's form),
an HF folder by transformers itself, and `random:<preset>` draws a fresh model from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.tokenizer import Tokenizer
from sluice.train.model.causal_lm import pretrained
from sluice.train.model.hf_fields import HF_FIELDS, hf_values
from sluice.train.model.presets import PRESETS
from sluice.train.model.source import model_path, tokenizer_for
from sluice.train.settings import RANDOM_PREFIX, TrainSettings

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(slots=True)
class TrainableModel:
    module: torch.nn.Module  # a transformers *ForCausalLM
    tokenizer: Tokenizer
    source: str  # what it was built from, for the run's records
    peft: Any = None  # a LoRA run: PEFT's PeftModel around `module` (model/lora.py), for writing the adapter


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates (all of them, but a LoRA run's adapters only)."""
    return [p for p in module.parameters() if p.requires_grad]


def hf_config(cfg: ModelConfig) -> PretrainedConfig:
    """A transformers config equal to a sluice ModelConfig (the reverse of ModelConfig.from_hf_dict)."""
    import transformers

    # transformers still takes the older keywords (rope_theta, rope_scaling) its types leave out
    common = hf_values(cfg, tuple(name for name in HF_FIELDS if name != "sliding_window"))
    common["eos_token_id"] = cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else (cfg.eos_token_ids or None)
    if cfg.rope_scaling:
        common["rope_scaling"] = cfg.rope_scaling
    if cfg.architecture == "llama":
        return transformers.LlamaConfig(**common, attention_bias=cfg.attention_bias)
    if cfg.architecture == "qwen2":
        return transformers.Qwen2Config(**common)
    if cfg.architecture == "mistral":
        return transformers.MistralConfig(**common, sliding_window=cfg.sliding_window)
    raise ModelLoadError(f"cannot train architecture {cfg.architecture!r}")


def _from_gguf(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from sluice.models.gguf.loader import load_gguf

    cfg, weights, _ = load_gguf(path, torch.float32, keep_quantized=False)
    module = AutoModelForCausalLM.from_config(hf_config(cfg), dtype=torch.float32, attn_implementation="sdpa")
    missing, unexpected = module.load_state_dict(weights, strict=False)
    allowed = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise ModelLoadError(
            f"{path}: weights do not match the architecture (missing {missing}, unexpected {unexpected})"
        )
    if cfg.tie_word_embeddings:
        module.tie_weights()
    return module


def _random(preset: str, tok: Tokenizer, seed: int) -> torch.nn.Module:
    import transformers

    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    config = transformers.LlamaConfig(
        **PRESETS[preset],
        vocab_size=tok.vocab_size,
        tie_word_embeddings=True,
        eos_token_id=eos,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    torch.manual_seed(seed)  # every rank draws the same model (FSDP shards it, DDP checks it)
    return transformers.LlamaForCausalLM._from_config(config, dtype=torch.float32, attn_implementation="sdpa")


def build_model(settings: TrainSettings) -> TrainableModel:
    """The full model on this process, in fp32 (parallel/ wraps or shards it afterwards)."""
    tok, _ = tokenizer_for(settings)
    if settings.is_random:
        module = _random(settings.model.removeprefix(RANDOM_PREFIX), tok, settings.seed)
        source = settings.model
    else:
        path = model_path(settings.model)
        if path.is_dir():
            from transformers import AutoModelForCausalLM

            module = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
        elif path.suffix == ".gguf":
            module = _from_gguf(path)
        else:
            raise ModelLoadError(f"{path} is neither a .gguf file nor a model folder")
        source = str(path)
    if settings.moe_experts:  # a mixture-of-experts variant (model/moe.py): random experts, or upcycled
        from sluice.train.model.moe import make_moe

        module = make_moe(
            module,
            settings.moe_experts,
            settings.moe_top_k,
            settings.moe_aux_loss,
            settings.seed,
            upcycle=not settings.is_random,
        )
    pretrained(module).config.use_cache = False
    if settings.dtype == "bfloat16":
        module = module.to(torch.bfloat16)
    peft = None
    if settings.lora_rank:  # PEFT's adapters injected in place, the base frozen (model/lora.py)
        from sluice.train.model.lora import add_lora

        peft = add_lora(module, settings)
    return TrainableModel(module, tok, source, peft)
