"""Shared fixtures: the bundled model, tiny random model folders, and a transformers reference."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from filelock import FileLock
from hypothesis import settings

from tests.cpu import has_avx2
from tests.tiny_models import write_tiny_model

# CI runs property tests with a fixed seed: a failure there is reproducible, never a one-off.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# httpx's default timeout is 5 s, which a busy CI machine (other suites on the same two cores)
# exceeds for a single generation. The tests bound their own waits where time matters; a request
# should fail the test only when it truly hangs. httpx binds one Timeout object as the default of
# every call, so widening that object widens every default.
_DEFAULT = httpx._config.DEFAULT_TIMEOUT_CONFIG
_DEFAULT.connect = _DEFAULT.read = _DEFAULT.write = _DEFAULT.pool = 120.0

# The same for connecting the Redis clients this process opens (sluice/redis_client.py reads it
# at each call): the product's 1 s connect timeout flags a sick store in production, but on a busy
# CI machine the event loop itself can go a second without the CPU, and 20 concurrent claims once
# failed connecting (test_concurrent_claims_have_exactly_one_winner[redis], TimeoutError). No test
# relies on a connect timing out (the Redis-down tests see a refused connection).
import sluice.redis_client as _redis_client  # noqa: E402

_redis_client.CONNECT_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2-135M-Instruct, loaded once per session."""
    from sluice.models.loader import load_model

    return load_model(progress=False)


@pytest.fixture(scope="session")
def bundled_torch():
    """The same model on the portable torch path (fp32 weights, torch ops): the fallback."""
    from sluice.models.loader import load_model

    return load_model(progress=False, kernels="torch")


# The two ways sluice computes a forward; correctness tests run on both.
PATHS = ["kernels", "torch"]


@pytest.fixture(scope="module", params=PATHS)
def path(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def bundled_on_path(request, path):
    """The bundled model on the CPU kernels (the default) or on the torch fallback."""
    if path == "kernels":
        model = request.getfixturevalue("bundled")
        assert model.model.uses_kernels or not has_avx2(), "the kernels should run on this CPU"
        return model
    return request.getfixturevalue("bundled_torch")


@pytest.fixture(scope="session")
def hf_bundled(tmp_path_factory):
    """transformers' own load of the same GGUF file (fp32): the correctness reference.

    transformers dequantizes the GGUF file in about a minute of CPU (two on busy cores), and
    under xdist every worker that reaches a test using it would pay that again. The first worker
    converts it and leaves the fp32 tensors in a safetensors folder of the session's (a GGUF-loaded
    model refuses save_pretrained, so the tensors and the config are written as they are); the
    others load that in a second: the same tensors bit for bit, so the same logits."""
    from transformers import AutoModelForCausalLM

    from sluice.models.loader import default_model_path

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _hf_from_gguf(default_model_path())
    root = tmp_path_factory.getbasetemp().parent
    folder = root / "hf-bundled"
    with FileLock(str(root / "hf-bundled.lock"), timeout=1800):
        if not (folder / "config.json").exists():
            model = _hf_from_gguf(default_model_path())
            shutil.rmtree(root / "hf-bundled.partial", ignore_errors=True)  # a worker's that failed writing
            _save_fp32(model, root / "hf-bundled.partial")
            (root / "hf-bundled.partial").rename(folder)  # whole or absent
            return model
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def _hf_from_gguf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def _save_fp32(model, folder: Path) -> None:
    import json

    from safetensors.torch import save_file

    folder.mkdir()
    tied = model.config.tie_word_embeddings  # the head is the embedding: saved once, tied again on load
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the GGUF file's, not the folder's
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-mistral"), "mistral")


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    from sluice.models.loader import load_model

    return load_model(tiny_llama_dir, progress=False)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server for the whole session (tests use distinct key names)."""
    from tests.redis_server import RedisServer

    server = RedisServer()
    yield server
    server.stop()
