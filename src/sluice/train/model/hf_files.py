"""Write a Hugging Face model folder: config.json, model.safetensors, tokenizer files.

sluice's folder loader (models/hf_folder.py) and transformers both read what is written here:
`tokenizer.json` is the Rust tokenizer the model trained with (for the bundled GGUF, the one
sluice builds from the file's metadata), and `tokenizer_config.json` carries the chat template
and the special tokens, so the served model renders prompts exactly as training did.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from sluice.models.tokenizer import Tokenizer
from sluice.train.model.causal_lm import pretrained

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_tokenizer(tok: Tokenizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dst / name)


def write_model_folder(module: torch.nn.Module, folder: Path, tokenizer_dir: Path) -> None:
    """`module` (a full, unsharded *ForCausalLM) as an HF folder, tokenizer copied from `tokenizer_dir`."""
    folder.mkdir(parents=True, exist_ok=True)
    model = pretrained(module)
    model.config.use_cache = True  # the served model generates
    model.save_pretrained(str(folder), safe_serialization=True)
    copy_tokenizer(tokenizer_dir, folder)
