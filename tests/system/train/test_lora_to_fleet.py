"""The LoRA path from training to traffic, as one system: 2-rank LoRA training on the chat file →
`sluice train export` of two of its checkpoints (steps 6 and 8: two versions of one adapter) →
both enter a RUNNING `sluice serve` without a restart (`sluice fleet load-adapter`, and a fleet
file reloaded with `sluice fleet reload`) → a 50 % sticky canary between the two adapter versions
(`sluice fleet weights`) → every answer equals transformers + PEFT's greedy output for the
version it went to (the version header says which), and the base model still answers as itself.

One gateway with one local replica of the tiny base folder; the adapters run on its worker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import torch

from tests.fleet_process import ADMIN, sluice_cli
from tests.server_process import start_server
from tests.system.train.conftest import RUN_TIMEOUT_S, train_cmd

MAX_TOKENS = 8
PROMPT = "What is 11 plus 11?"


def _base_fleet(base: Path) -> str:
    return f"""
[models.tiny.versions.base]
weights = "{base}"
traffic = 100
replicas = 1
[models.tiny.versions.base.engine]
kv_cache_gib = 0.02
max_num_seqs = 4
"""


def _with_adapter_versions(base: Path, v1: Path, v2: Path) -> str:
    return (
        _base_fleet(base)
        + f"""
[models.ft.versions.v1]
adapter = "{v1}"
base = "tiny/base"
traffic = 100
[models.ft.versions.v2]
adapter = "{v2}"
base = "tiny/base"
traffic = 0
"""
    )


@pytest.fixture(scope="module")
def versions(train_dir: Path, lora_ddp2: Path, lora_export: Path) -> dict[str, Path]:
    """The run's newest checkpoint (step 8, the session's export) and an older one (step 6)."""
    older = train_dir / "exports" / "lora-step6"
    proc = subprocess.run(
        train_cmd("export", str(lora_ddp2), "--out", str(older), "--step", "6"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"v1": older, "v2": lora_export}


@pytest.fixture(scope="module")
def fleet(train_dir: Path, tiny_folder: Path):
    path = train_dir / "lora-fleet.toml"
    path.write_text(_base_fleet(tiny_folder))
    server = start_server(["--fleet", str(path)], env={"SLUICE_ADMIN_KEY": ADMIN})
    try:
        yield server, path
    finally:
        server.stop()


def _ask(server, model: str, user: str) -> tuple[str, str, int]:
    """(version header, text, output tokens) of one greedy Messages call."""
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "metadata": {"user_id": user},
        "messages": [{"role": "user", "content": PROMPT}],
    }
    r = httpx.post(server.base_url + "/v1/messages", json=body, headers={"sluice-cache": "bypass"}, timeout=300)
    assert r.status_code == 200, r.text
    reply = r.json()
    return (
        r.headers["sluice-model-version"],
        reply["content"][0]["text"].rstrip("\ufffd"),
        reply["usage"]["output_tokens"],
    )


def _reference(base: Path, adapter: Path | None) -> tuple[str, int]:
    """transformers' greedy continuation of PROMPT on `base` (+ PEFT's `adapter`), rendered with
    the gateway's own template; a cut-off UTF-8 tail dropped, as the server's detokenizer holds it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sluice.models.tokenizer_loader import load_tokenizer
    from tests.reference import hf_greedy

    tok, _ = load_tokenizer(base)
    prompt = tok.encode_chat([{"role": "user", "content": PROMPT}])
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    ref = hf_greedy(model, prompt, MAX_TOKENS, eos=tok.eos_token_ids)
    text = tok.decode([t for t in ref.tokens if t not in tok.eos_token_ids])
    return text.rstrip("\ufffd"), len(ref.tokens)


def test_a_trained_adapter_is_loaded_live_then_canaried_and_answers_like_peft(fleet, versions, tiny_folder) -> None:
    server, path = fleet
    expected = {name: _reference(tiny_folder, folder) for name, folder in versions.items()}
    base = _reference(tiny_folder, None)
    assert len({expected["v1"], expected["v2"], base}) == 3, "the two adapter versions and the base answer alike"
    cli = ("--url", server.base_url, "--admin-key", ADMIN)

    # loaded into the running server, no restart: served at once under its name
    out = sluice_cli("fleet", "load-adapter", "ft-live", str(versions["v2"]), *cli)
    assert out.returncode == 0, out.stderr
    assert _ask(server, "ft-live", "u-live") == ("ft-live/default", *expected["v2"])
    assert _ask(server, "tiny", "u-base") == ("tiny/base", *base)

    # both versions of the adapter join the running fleet (a reload), then a 50 % sticky canary
    path.write_text(_with_adapter_versions(tiny_folder, versions["v1"], versions["v2"]))
    out = sluice_cli("fleet", "reload", *cli)
    assert out.returncode == 0, out.stderr
    assert _ask(server, "ft", "u-before") == ("ft/v1", *expected["v1"])  # v2 has no traffic yet
    out = sluice_cli("fleet", "weights", "ft", "v1=50", "v2=50", *cli)
    assert out.returncode == 0, out.stderr
    seen: dict[str, str] = {}
    for i in range(12):
        for _ in range(2):  # sticky: a user asks twice and stays on one version
            version, text, tokens = _ask(server, "ft", f"user-{i}")
            assert seen.setdefault(f"user-{i}", version) == version
            assert (text, tokens) == expected[version.removeprefix("ft/")], (version, text)
    assert set(seen.values()) == {"ft/v1", "ft/v2"}, seen  # 12 users, 50/50: both (p of a miss 2^-11)
    assert server.process.poll() is None  # the same server throughout
