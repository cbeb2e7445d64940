"""The parts of a transformers *ForCausalLM that parallel/ and the writers reach into, typed once.

torch.nn.Module's `__getattr__` is typed `Tensor | Module`, so `module.model.layers` reads as a
union to mypy at every use. `parts` checks each part's class where it is taken (a model of another
shape fails here, naming the part, instead of deep inside a torch call) and returns them typed.
Llama, Qwen2, Mistral and Mixtral (model/moe.py) share the layout: `model.embed_tokens`,
`model.layers`, `model.norm`, `model.rotary_emb`, `lm_head`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from torch import nn

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

_M = TypeVar("_M", bound=nn.Module)


def _part(owner: nn.Module, name: str, cls: type[_M]) -> _M:
    value = getattr(owner, name)
    if not isinstance(value, cls):
        raise TypeError(f"not a transformers *ForCausalLM: its {name} is a {type(value).__name__}, not {cls.__name__}")
    return value


def pretrained(module: nn.Module) -> PreTrainedModel:
    """`module` as transformers' model class (its config, save_pretrained)."""
    from transformers import PreTrainedModel

    if not isinstance(module, PreTrainedModel):
        raise TypeError(f"not a transformers model: {type(module).__name__}")
    return module


@dataclass(frozen=True, slots=True)
class CausalLMParts:
    config: PretrainedConfig
    decoder: nn.Module  # `model`: the stack under the head
    embed_tokens: nn.Embedding
    layers: nn.ModuleList
    norm: nn.Module  # the final RMSNorm
    rotary_emb: nn.Module
    lm_head: nn.Linear


def parts(module: nn.Module) -> CausalLMParts:
    inner = _part(module, "model", nn.Module)
    return CausalLMParts(
        config=pretrained(module).config,
        decoder=inner,
        embed_tokens=_part(inner, "embed_tokens", nn.Embedding),
        layers=_part(inner, "layers", nn.ModuleList),
        norm=_part(inner, "norm", nn.Module),
        rotary_emb=_part(inner, "rotary_emb", nn.Module),
        lm_head=_part(module, "lm_head", nn.Linear),
    )


def layer_norms(layer: nn.Module) -> list[nn.Module]:
    """A decoder layer's two RMSNorms (before attention, before the MLP)."""
    return [_part(layer, "input_layernorm", nn.Module), _part(layer, "post_attention_layernorm", nn.Module)]
