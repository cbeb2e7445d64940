"""Where a run's model and tokenizer come from (no torch: the launcher tokenizes with this)."""

from __future__ import annotations

from pathlib import Path

from sluice.models.bundled import default_model_path
from sluice.models.tokenizer import Tokenizer
from sluice.models.tokenizer_loader import load_tokenizer
from sluice.train.settings import BUNDLED, TrainSettings


def model_path(spec: str) -> Path:
    return default_model_path() if spec == BUNDLED else Path(spec).expanduser()


def tokenizer_for(settings: TrainSettings) -> tuple[Tokenizer, str]:
    """The tokenizer the data is encoded with, and an id for the data cache's key."""
    spec = settings.tokenizer if settings.is_random else settings.model
    path = model_path(spec)
    tok, _ = load_tokenizer(path)
    return tok, f"{path.resolve()}:{tok.vocab_size}"
