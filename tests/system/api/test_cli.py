"""`sluice generate` end to end, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _sluice(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_help_documents_every_flag():
    out = _sluice("generate", "--help").stdout
    for flag in (
        "--prompt",
        "--model",
        "--max-tokens",
        "--temperature",
        "--system",
        "--top-k",
        "--top-p",
        "--seed",
        "--stop",
        "--dtype",
    ):
        assert flag in out


@pytest.mark.slow
def test_generate_streams_a_reply_from_the_bundled_model():
    proc = _sluice("generate", "--prompt", "What is the capital of France?", "--max-tokens", "20")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "prompt +" in proc.stderr  # the usage line


def test_unknown_model_path_is_a_clear_error(tmp_path):
    proc = _sluice("generate", "--prompt", "hi", "--model", str(tmp_path / "nope.gguf"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_max_tokens_is_a_clear_error():
    proc = _sluice("generate", "--prompt", "hi", "--max-tokens", "0")
    assert proc.returncode == 2
    assert "max_tokens" in proc.stderr and "Traceback" not in proc.stderr
