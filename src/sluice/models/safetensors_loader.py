"""Load a local Hugging Face model folder: config.json + *.safetensors + tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import tokenizers
import torch

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.tokenizer import Tokenizer

Progress = Callable[[int, int], None]


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None


def load_safetensors_folder(
    folder: Path, dtype: torch.dtype = torch.float32, progress: Progress | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    from safetensors.torch import load_file

    cfg = _read_json(folder / "config.json")
    if not cfg:
        raise ModelLoadError(f"{folder} has no config.json")
    config = ModelConfig.from_hf_dict(cfg, name=folder.name)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weight files")
    weights: dict[str, torch.Tensor] = {}
    for i, file in enumerate(files):
        try:
            for name, tensor in load_file(str(file)).items():
                weights[name] = tensor.to(dtype)
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"cannot read {file}: {exc}") from None
        if progress:
            progress(i + 1, len(files))
    gen = _read_json(folder / "generation_config.json")
    eos = gen.get("eos_token_id", None)
    if eos is not None:
        config.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
    return config, weights, _tokenizer(folder, config)


def _tokenizer(folder: Path, config: ModelConfig) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{folder} has no tokenizer.json")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    tcfg = _read_json(folder / "tokenizer_config.json")
    template = tcfg.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()

    def token_text(value: object) -> str | None:
        return value.get("content") if isinstance(value, dict) else value  # type: ignore[return-value]

    eos_ids = list(config.eos_token_ids)
    eos = token_text(tcfg.get("eos_token"))
    if eos is not None and (eid := backend.token_to_id(eos)) is not None and eid not in eos_ids:
        eos_ids.append(eid)
    config.eos_token_ids = eos_ids
    return Tokenizer(
        backend=backend,
        chat_template=template,
        bos_token=token_text(tcfg.get("bos_token")),
        eos_token=eos,
        eos_token_ids=eos_ids,
        add_bos=bool(tcfg.get("add_bos_token", False)),
    )
