"""The bundled model with LoRA adapters made by PEFT (rank 16 on every linear, and two narrower
ones): in one batch mixing base rows with rows for three adapters, with chunked prefill and
requests joining while others decode, each row's greedy output equals transformers + PEFT's for
its adapter (base rows: transformers'), on the CPU kernels and on the torch path."""

from __future__ import annotations

import warnings

import pytest

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import AdapterRef, GenerationRequest, SamplingParams
from tests.lora_adapters import greedy_with, peft_adapter, peft_multi
from tests.reference import compare

MAX_TOKENS = 40
CHATS = [
    "Hi!",
    "What is the capital of France?",
    "Write a short poem about autumn leaves falling in a quiet park.",
    "Explain, step by step, how a bicycle stays upright while moving.",
    "Translate 'good morning' into Spanish.",
    "List five fruits that are red, one per line.",
    "What is 17 times 23? Show the steps.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
]
PLAN = [None, "wide", "narrow", "mlp", "wide", None, "mlp", "narrow"]
_refs: dict = {}


@pytest.fixture(scope="module")
def lora_setup(hf_bundled, tmp_path_factory):
    root = tmp_path_factory.mktemp("bundled-adapters")
    folders = {
        "wide": peft_adapter(hf_bundled, root / "wide", rank=16, alpha=32, seed=11, std=0.02),
        "narrow": peft_adapter(
            hf_bundled, root / "narrow", rank=8, alpha=16, seed=12, std=0.04, targets=("q_proj", "v_proj")
        ),
        "mlp": peft_adapter(
            hf_bundled, root / "mlp", rank=4, alpha=8, seed=13, std=0.03, targets=("gate_proj", "up_proj", "down_proj")
        ),
    }
    return folders, peft_multi(hf_bundled, folders)


@pytest.mark.slow
def test_bundled_model_with_three_adapters_matches_peft(bundled_on_path, lora_setup):
    folders, reference = lora_setup
    tok = bundled_on_path.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    engine = LLMEngine(bundled_on_path, EngineConfig(max_num_batched_tokens=48, num_kv_blocks=512))

    def request(i: int) -> GenerationRequest:
        name = PLAN[i]
        return GenerationRequest(
            f"r{i}",
            prompts[i],
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
            adapter=AdapterRef(name, str(folders[name])) if name else None,
        )

    got: dict[str, list[int]] = {}
    for i in range(5):
        engine.add_request(request(i))
    steps = 0
    while engine.has_unfinished():
        if steps == 4:  # three more join while the first five prefill and decode
            for i in range(5, len(CHATS)):
                engine.add_request(request(i))
        for ev in engine.step():
            got.setdefault(ev.request_id, []).extend(ev.token_ids)
        steps += 1
    notes = []
    for i, prompt in enumerate(prompts):
        key = (i, PLAN[i])
        if key not in _refs:  # the reference is the same for both paths
            _refs[key] = greedy_with(reference, PLAN[i], prompt, MAX_TOKENS, tok.eos_token_ids)
        notes.append(compare(_refs[key], got[f"r{i}"], f"prompt {i} ({PLAN[i] or 'base'})"))
    if (1, None) not in _refs:
        _refs[(1, None)] = greedy_with(reference, None, prompts[1], MAX_TOKENS, tok.eos_token_ids)
    assert _refs[(1, "wide")].tokens != _refs[(1, None)].tokens, "the adapter changes the output"
    for note in filter(None, notes):
        warnings.warn(note, stacklevel=2)
