"""Load only a model's tokenizer and config — for processes that tokenize but do not run it.

The HTTP process tokenizes and applies the chat template once and sends token ids to the engine
worker; it needs the tokenizer, not the weights. Nothing here imports torch (a test checks it):
reading a GGUF's metadata maps the file and parses its header (models/gguf/file.py), and a
folder's tokenizer is its tokenizer.json, so the gateway starts without torch's ~2 s import and
~200 MiB of resident memory.
"""

from __future__ import annotations

from pathlib import Path

from sluice.errors import ModelLoadError
from sluice.models.bundled import default_model_path
from sluice.models.config import ModelConfig
from sluice.models.gguf.metadata import file_config, open_gguf, tokenizer
from sluice.models.hf_folder import folder_tokenizer, read_json
from sluice.models.tokenizer import Tokenizer


def load_tokenizer(path: str | Path | None = None) -> tuple[Tokenizer, ModelConfig]:
    resolved = Path(path).expanduser() if path else default_model_path()
    if not resolved.exists():
        raise ModelLoadError(f"model path {resolved} does not exist")
    if resolved.is_dir():
        cfg = read_json(resolved / "config.json")
        if not cfg:
            raise ModelLoadError(f"{resolved} has no config.json")
        config = ModelConfig.from_hf_dict(cfg, name=resolved.name)
        return folder_tokenizer(resolved, config), config
    if resolved.suffix != ".gguf":
        raise ModelLoadError(f"{resolved} is neither a .gguf file nor a model folder")
    gguf = open_gguf(resolved)
    return tokenizer(gguf.metadata, resolved), file_config(gguf)
