"""Read, check, tokenize and pack the training file once; every rank and restart maps the result.

The launcher runs this before any worker starts (so bad lines stop the run before processes
are spent) and writes `data/tokens.npy`, `data/mask.npy` and `data/meta.json` into the run
folder. The cache is keyed by the data file's content hash, the tokenizer and `seq_len`; a
restart or a resumed run reuses it, and a changed file is tokenized again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sluice.models.tokenizer import Tokenizer
from sluice.train.data.packing import pack
from sluice.train.data.records import parse_record
from sluice.train.data.tokenize import Tokenized, tokenize_example
from sluice.train.errors import TrainDataError

CACHE_VERSION = 1


@dataclass(frozen=True, slots=True)
class PackedData:
    tokens: np.ndarray  # int32 [rows, seq_len]
    mask: np.ndarray  # bool [rows, seq_len]
    meta: dict

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


def _fingerprint(data: Path, tokenizer_id: str, seq_len: int) -> str:
    h = hashlib.sha256()
    with data.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(f"|{tokenizer_id}|{seq_len}|{CACHE_VERSION}".encode())
    return h.hexdigest()


def read_examples(data: Path, tok: Tokenizer, skip_bad: bool) -> tuple[list[Tokenized], list[str]]:
    """Every line's tokens, and `FILE:LINE: problem` for each bad line (raised unless skip_bad)."""
    examples: list[Tokenized] = []
    problems: list[str] = []
    try:
        handle = data.open(encoding="utf-8")
    except OSError as exc:
        raise TrainDataError([f"{data}: cannot read ({exc.strerror or exc})"]) from None
    with handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue  # blank lines separate nothing and carry nothing
            try:
                examples.append(tokenize_example(tok, parse_record(line)))
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(f"{data}:{lineno}: {exc}")
    if problems and not skip_bad:
        raise TrainDataError(problems)
    if not examples:
        raise TrainDataError([f"{data}: no training examples" + (" left after the bad lines" if problems else "")])
    return examples, problems


def prepare(data: Path, tok: Tokenizer, tokenizer_id: str, seq_len: int, folder: Path, skip_bad: bool) -> dict:
    """Tokenize and pack `data` into `folder` unless an up-to-date cache is there; its meta."""
    if not data.is_file():
        raise TrainDataError([f"{data}: no such file"])
    fingerprint = _fingerprint(data, tokenizer_id, seq_len)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fingerprint:
            return meta
    examples, problems = read_examples(data, tok, skip_bad)
    pad = tok.eos_token_ids[0] if tok.eos_token_ids else 0
    tokens, mask = pack(examples, seq_len, pad)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "tokens.npy", tokens)
    np.save(folder / "mask.npy", mask)
    meta = {
        "fingerprint": fingerprint,
        "source": str(data),
        "examples": len(examples),
        "bad_lines": problems,
        "rows": int(tokens.shape[0]),
        "seq_len": seq_len,
        "tokens": int(tokens.size),
        "loss_tokens": int(mask.sum()),
    }
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(meta_path)  # written last: a half-written cache never looks valid
    return meta


def load(folder: Path) -> PackedData:
    meta = json.loads((folder / "meta.json").read_text())
    return PackedData(np.load(folder / "tokens.npy", mmap_mode="r"), np.load(folder / "mask.npy", mmap_mode="r"), meta)
