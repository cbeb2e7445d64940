"""The whole path: train (2 ranks) → `sluice train export` → sluice loads the folder and its greedy
output equals transformers' on the same folder, token for token; the weights are the trained
ones, not the starting point's."""

from __future__ import annotations

import subprocess

import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model
from sluice.train.checkpoint import layout
from sluice.types import GenerationRequest, SamplingParams
from tests.reference import compare, hf_greedy
from tests.system.train.conftest import train_cmd

PROMPTS = ["What is 3 plus 3?", "What is 11 plus 11?", "Hello there"]


def test_export_then_serve_equals_transformers(tiny_folder, exported):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = exported  # the fixture checks the command's exit and its "exported step N" line
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not (out.parent / "r1.partial").exists()
    trained, start = load_file(str(out / "model.safetensors")), load_file(str(tiny_folder / "model.safetensors"))
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], start["model.layers.0.mlp.up_proj.weight"])

    loaded = load_model(out, progress=False)
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=64))
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    for i, text in enumerate(PROMPTS):
        prompt = loaded.tokenizer.encode_chat([{"role": "user", "content": text}])
        got = engine.generate([GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=16, temperature=0.0))])
        ref = hf_greedy(hf, prompt, 16, eos=loaded.tokenizer.eos_token_ids)
        note = compare(ref, got[f"r{i}"].token_ids, f"prompt {i}")
        assert note is None, note


def test_export_names_a_missing_checkpoint(train_dir, ddp2_run):
    proc = subprocess.run(
        train_cmd("export", str(ddp2_run), "--out", str(train_dir / "x"), "--step", "5"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    steps = ", ".join(map(str, layout.complete_steps(ddp2_run / "checkpoints")))
    assert f"no checkpoint of step 5 (complete: {steps})" in proc.stderr
