"""The device path, on every machine: the `device` setting from flags and settings to the loader
and the worker, the clear error when CUDA is asked for and absent, and the code the GPU runs
(SDPA decode attention, staged step inputs, the read-back-free nucleus) exercised on the CPU.
The same code on a CUDA device: tests/unit/models/test_gpu.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import torch

from sluice.config import SettingsError, load_settings
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.engine.runner import ModelRunner
from sluice.engine.staging import stage
from sluice.errors import EngineUnavailableError
from sluice.models.attention import AttentionMetadata, TorchPagedAttention
from sluice.models.device import resolve_device
from sluice.models.loader import load_model
from sluice.models.sampler import _nucleus, _nucleus_on_device
from sluice.models.sdpa_attention import SdpaPagedAttention
from sluice.types import GenerationRequest, SamplingParams
from sluice.worker.spawn import engine_argv, spawn_local_worker
from tests.reference import compare, hf_greedy

NO_CUDA = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # torch sees no CUDA device, GPU host or not


def _sluice(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=180, env=env
    )


def _greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 24) -> list[list[int]]:
    reqs = [
        GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        for i, p in enumerate(prompts)
    ]
    results = engine.generate(reqs)
    return [results[r.request_id].token_ids for r in reqs]


# -- the setting -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_names_parse_in_settings_and_engine_config(name):
    settings = load_settings(None, device=name)
    assert settings.device == name
    assert EngineConfig.from_settings(settings).device == name


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", "cpu:0", ""])
def test_bad_device_names_are_refused_naming_the_setting(name):
    with pytest.raises(SettingsError, match=r"device: .*auto, cpu, cuda or cuda:N"):
        load_settings(None, device=name)
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        EngineConfig(device=name)


def test_device_defaults_to_auto_and_env_sets_it(monkeypatch):
    assert load_settings(None).device == "auto" and EngineConfig().device == "auto"
    monkeypatch.setenv("SLUICE_DEVICE", "cpu")
    assert load_settings(None).device == "cpu"


def test_auto_is_cpu_without_cuda_and_cuda_without_a_device_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    for name in ("cuda", "cuda:0", "cuda:1"):
        with pytest.raises(
            SettingsError,
            match=rf"device = '{name}' \(setting `device`, flag --device\).*"
            r"torch.cuda.is_available\(\) is False",
        ):
            resolve_device(name)


def test_a_cuda_index_past_the_devices_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 1) == resolve_device("auto")
    with pytest.raises(SettingsError, match=r"has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_load_model_checks_the_device_before_reading_the_file(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SettingsError, match="device = 'cuda'"):
        load_model(tmp_path / "does-not-matter.gguf", device="cuda")


# -- explicit cpu through the plumbing = the default --------------------------------------------
@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_explicit_cpu_device_gives_the_default_output(tiny_llama_dir, kernels, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so that auto means cpu here too
    prompts = [[3 + (5 * i + 11 * j) % 250 for j in range(n)] for i, n in enumerate([4, 19, 37])]
    outputs = []
    for device in (None, "cpu", "auto"):
        kw = {} if device is None else {"device": device}
        loaded = load_model(tiny_llama_dir, progress=False, kernels=kernels, **kw)
        assert loaded.model.device == torch.device("cpu")
        engine = LLMEngine(
            loaded, EngineConfig(block_size=4, num_kv_blocks=128, max_num_batched_tokens=16, device=device or "auto")
        )
        assert all(k.device.type == "cpu" and v.device.type == "cpu" for k, v in engine.runner.kv_caches)
        outputs.append(_greedy(engine, prompts))
    assert outputs[0] == outputs[1] == outputs[2]


def test_bundled_model_on_explicit_cpu_matches_the_default(bundled):
    explicit = load_model(progress=False, device="cpu")
    assert explicit.model.uses_kernels == bundled.model.uses_kernels
    tok = bundled.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in ("Hi!", "What is the capital of France?")]
    cfg = EngineConfig(num_kv_blocks=128)
    assert _greedy(LLMEngine(explicit, cfg), prompts) == _greedy(LLMEngine(bundled, cfg), prompts)


# -- the GPU's code, run on the CPU -------------------------------------------------------------
def _random_step(seed: int, lens: list[int], kvh: int, group: int, d: int, bs: int = 4):
    g = torch.Generator().manual_seed(seed)
    nblocks = sum(-(-n // bs) for n in lens) + 1
    k_cache = torch.randn(kvh, nblocks * bs, d, generator=g)
    v_cache = torch.randn(kvh, nblocks * bs, d, generator=g)
    perm = (torch.randperm(nblocks - 1, generator=g) + 1).tolist()  # block 0 stays the null block
    tables, start = [], 0
    for n in lens:
        tables.append(perm[start : start + -(-n // bs)])
        start += len(tables[-1])
    width = max(map(len, tables))
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        num_decodes=len(lens),
        block_size=bs,
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
        max_context_len=max(lens),
        min_context_len=min(lens),
    )
    q = torch.randn(len(lens), kvh * group, d, generator=g)
    return q, k_cache, v_cache, meta


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("lens", [[9, 9, 9], [1, 13, 5, 22], [7]])
def test_sdpa_decode_attention_matches_the_torch_backend(lens, window):
    kvh, group, d = 2, 3, 16
    q, k_cache, v_cache, meta = _random_step(len(lens), lens, kvh, group, d)
    args = (kvh * group, kvh, d, window)
    ref, sdpa = TorchPagedAttention(*args), SdpaPagedAttention(*args)
    ref.prepare(meta)
    want = ref.attend(q.reshape(len(lens), -1), k_cache, v_cache, meta)
    meta.derived = None
    sdpa.prepare(meta)
    got = sdpa.attend(q.reshape(len(lens), -1), k_cache, v_cache, meta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # host-side sizing (the runner's max/min context) = reading them from the device tensors
    unsized = AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        num_decodes=meta.num_decodes,
        block_size=4,
        block_tables=meta.block_tables,
        context_lens=meta.context_lens,
    )
    ref.prepare(unsized)
    torch.testing.assert_close(ref.attend(q.reshape(len(lens), -1), k_cache, v_cache, unsized), want, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_sdpa_backend_in_the_engine_matches_transformers(arch, request):
    import transformers

    folder = request.getfixturevalue(f"tiny_{arch}_dir")
    loaded = load_model(folder, progress=False, kernels="torch")
    cfg = loaded.config
    loaded.model.attention = SdpaPagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32").eval()
    prompts = [[3 + (7 * i + j * 13) % 250 for j in range(n)] for i, n in enumerate([5, 17, 40, 63])]
    engine = LLMEngine(loaded, EngineConfig(block_size=4, max_num_batched_tokens=32, num_kv_blocks=512))
    for i, (prompt, tokens) in enumerate(zip(prompts, _greedy(engine, prompts, max_tokens=32))):
        compare(hf_greedy(hf, prompt, 32, eos=2), tokens, f"{arch} prompt {i}")


def test_stage_keeps_values_shapes_and_dtypes():
    host = [
        torch.arange(5),
        torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
        torch.tensor([[True, False]]),
        torch.arange(3) + 7,
        torch.empty(0, dtype=torch.long),
        torch.tensor([9], dtype=torch.int32),
    ]
    moved = stage(host, torch.device("cpu"))
    assert len(moved) == len(host)
    for a, b in zip(host, moved):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_staged_step_inputs_give_the_same_tokens(tiny_llama_dir, monkeypatch):
    """The runner's GPU input path (one copy per dtype, then every field unpacked in order)
    forced on the CPU: chunked prefill, prefix hits (masked chunks) and decodes, same tokens."""
    loaded = load_model(tiny_llama_dir, progress=False, kernels="torch")
    shared = [5 + j % 200 for j in range(24)]
    prompts = [shared + [7 + i, 9 + i, 11] for i in range(3)] + [[3 + (11 * j) % 250 for j in range(45)]]
    cfg = EngineConfig(block_size=4, num_kv_blocks=256, max_num_batched_tokens=16)

    def run() -> list[list[int]]:
        engine = LLMEngine(loaded, cfg)
        first = _greedy(engine, prompts[:1])  # its blocks are cached: the others hit them
        return first + _greedy(engine, prompts[1:])

    default = run()
    prepare, calls = ModelRunner.prepare, []

    def staged(self, out):
        inp = prepare(self, out)
        self._stage(inp)
        calls.append(any(s.mask is not None for s in inp.meta.prefills))
        return inp

    monkeypatch.setattr(ModelRunner, "prepare", staged)
    assert run() == default
    assert calls and any(calls), "no masked prefill chunk was staged"


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_the_device_nucleus_keeps_the_cpu_nucleus(top_p):
    probs = torch.softmax(torch.randn(3000, generator=torch.Generator().manual_seed(4)) * 3, dim=-1)
    kept_p, kept_ids = _nucleus(probs, top_p)
    p, ids = _nucleus_on_device(probs, top_p)
    assert set(ids[p > 0].tolist()) == set(kept_ids.tolist())
    torch.testing.assert_close(p[p > 0].sort().values, kept_p.sort().values, rtol=0, atol=0)


# -- flags and the worker ------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["serve", "worker", "generate"])
def test_device_flag_is_in_help(command):
    out = _sluice(command, "--help").stdout
    assert "--device DEVICE" in out and "cuda:N" in out
    assert "float16" in out  # the dtype for GPUs


def test_worker_asked_for_cuda_without_a_device_exits_2_naming_the_setting(tmp_path):
    proc = _sluice("worker", "--device", "cuda", "--listen", f"unix:{tmp_path}/w.sock", env=NO_CUDA)
    assert proc.returncode == 2, proc.stderr
    assert "device = 'cuda' (setting `device`, flag --device)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_refuses_a_bad_device_name():
    proc = _sluice("serve", "--device", "gpu", "--port", "0")
    assert proc.returncode == 2 and "device" in proc.stderr and "Traceback" not in proc.stderr


def test_the_spawned_worker_gets_the_device_in_its_engine_config(tiny_llama_dir, monkeypatch):
    settings = load_settings(None, device="cuda:0")
    argv = engine_argv(EngineConfig.from_settings(settings))
    assert json.loads(argv[argv.index("--engine-config") + 1])["device"] == "cuda:0"
    # The child acts on it: with no CUDA device visible it stops with the setting's error
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(EngineUnavailableError, match="exited with code 2") as err:
        asyncio.run(spawn_local_worker(str(tiny_llama_dir), engine_args=argv, timeout_s=120))
    assert "device = 'cuda:0'" in str(err.value)
    # ...and the same spawn with device cpu becomes ready
    argv = engine_argv(EngineConfig.from_settings(load_settings(None, device="cpu", kv_cache_gib=0.05)))
    worker = asyncio.run(spawn_local_worker(str(tiny_llama_dir), engine_args=argv, timeout_s=120))
    worker.stop(grace_s=5)
