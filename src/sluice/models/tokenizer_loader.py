"""Load only a model's tokenizer and config — for processes that tokenize but do not run it.

The HTTP process tokenizes and applies the chat template once and sends token ids to the engine
worker; it needs the tokenizer, not the weights (reading a GGUF's metadata maps the file but
dequantizes nothing).
"""

from __future__ import annotations

from pathlib import Path

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.gguf_loader import _config, _metadata, _open, _tokenizer
from sluice.models.loader import default_model_path
from sluice.models.safetensors_loader import _read_json
from sluice.models.safetensors_loader import _tokenizer as _folder_tokenizer
from sluice.models.tokenizer import Tokenizer


def load_tokenizer(path: str | Path | None = None) -> tuple[Tokenizer, ModelConfig]:
    resolved = Path(path).expanduser() if path else default_model_path()
    if not resolved.exists():
        raise ModelLoadError(f"model path {resolved} does not exist")
    if resolved.is_dir():
        cfg = _read_json(resolved / "config.json")
        if not cfg:
            raise ModelLoadError(f"{resolved} has no config.json")
        config = ModelConfig.from_hf_dict(cfg, name=resolved.name)
        return _folder_tokenizer(resolved, config), config
    if resolved.suffix != ".gguf":
        raise ModelLoadError(f"{resolved} is neither a .gguf file nor a model folder")
    reader = _open(resolved)
    meta = _metadata(reader)
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return _tokenizer(meta, resolved), _config(meta, has_output, name=resolved.stem)
