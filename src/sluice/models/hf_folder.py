"""A local Hugging Face model folder's small files: config.json and friends, and the tokenizer.

No torch here: the gateway reads a folder model's tokenizer through this module; the weights
(models/safetensors_loader.py) only in the worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from sluice.errors import ModelLoadError
from sluice.models.config import ModelConfig
from sluice.models.tokenizer import Tokenizer


def read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None


def folder_tokenizer(folder: Path, config: ModelConfig) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{folder} has no tokenizer.json")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    tcfg = read_json(folder / "tokenizer_config.json")
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
