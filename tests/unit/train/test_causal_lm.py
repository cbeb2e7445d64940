"""model/causal_lm.py: the typed parts of a transformers *ForCausalLM, checked where taken."""

from __future__ import annotations

import pytest
import torch
import transformers

from sluice.train.model.causal_lm import layer_norms, parts, pretrained
from sluice.train.model.presets import PRESETS


def _tiny() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(**PRESETS["tiny"], vocab_size=32, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config)


def test_the_parts_are_the_models_own_modules() -> None:
    model = _tiny()
    p = parts(model)
    assert p.decoder is model.model and p.layers is model.model.layers and p.lm_head is model.lm_head
    assert p.embed_tokens is model.model.embed_tokens and p.norm is model.model.norm
    assert p.rotary_emb is model.model.rotary_emb and p.config is model.config
    first = p.layers[0]
    assert layer_norms(first) == [first.input_layernorm, first.post_attention_layernorm]


def test_a_module_of_another_shape_is_refused_naming_the_part() -> None:
    with pytest.raises(TypeError, match="not a transformers model: Linear"):
        pretrained(torch.nn.Linear(2, 2))
    model = _tiny()
    model.lm_head = torch.nn.Identity()
    with pytest.raises(TypeError, match="its lm_head is a Identity, not Linear"):
        parts(model)
    model = _tiny()
    model.model.layers = torch.nn.ModuleDict({"0": model.model.layers[0]})  # a pipeline stage's layout
    with pytest.raises(TypeError, match="its layers is a ModuleDict, not ModuleList"):
        parts(model)
