"""Load a local Hugging Face model folder: config.json + *.safetensors + tokenizer files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.hf_folder import folder_tokenizer, read_json
from sluice.models.tokenizer import Tokenizer

Progress = Callable[[int, int], None]


def load_safetensors_folder(
    folder: Path, dtype: torch.dtype = torch.float32, progress: Progress | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    from safetensors.torch import load_file

    cfg = read_json(folder / "config.json")
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
    gen = read_json(folder / "generation_config.json")
    eos = gen.get("eos_token_id", None)
    if eos is not None:
        config.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
    return config, weights, folder_tokenizer(folder, config)
