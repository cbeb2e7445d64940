"""Resolve a model path (default: the bundled SmolLM2 GGUF), load it, show progress."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sluice.errors import ModelLoadError
from sluice.models.bundled import default_model_path
from sluice.models.config import ModelConfig
from sluice.models.device import resolve_device
from sluice.models.gguf.loader import load_gguf
from sluice.models.kernels import KernelChoice, kernel_ops
from sluice.models.llama import LlamaModel
from sluice.models.quantized import Weight
from sluice.models.safetensors_loader import load_safetensors_folder
from sluice.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from tqdm import tqdm

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer
    path: Path


class _Bar:
    """A tqdm bar on a terminal, nothing otherwise (logs and pipes stay clean)."""

    def __init__(self, label: str, enabled: bool | None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.label = label
        self.bar: tqdm | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=self.label, unit="tensor", leave=False, file=sys.stderr)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _return_freed_memory() -> None:
    """Hand the loader's freed scratch back to the OS (glibc keeps it otherwise).

    Reading a GGUF file allocates about a million small objects (metadata views, the tokenizer's
    strings) and the weights' temporary copies; once they are gone, glibc still holds ~70 MB of
    free heap for the bundled model, counted in the process's resident memory."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def load_model(
    path: str | Path | None = None,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    progress: bool | None = None,
    kernels: KernelChoice | str = KernelChoice.AUTO,
) -> LoadedModel:
    """Load a GGUF file or a Hugging Face folder. `progress=None` shows a bar only on a terminal.

    `kernels`: AUTO runs the CPU kernels when they build (fp32 on CPU only), keeping Q4_1/Q8_0
    weights in their blocks; TORCH forces the portable path with fp32 weights.
    `device`: cpu, cuda, cuda:N or auto (models/device.py); checked before the file is read, so
    asking for a GPU that is not there fails at once. Weights, RoPE tables and (through the
    engine) the KV pool live there; the CPU kernels run only on the CPU.
    """
    target = resolve_device(device)
    resolved = Path(path).expanduser() if path else default_model_path()
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if not resolved.exists():
        raise ModelLoadError(f"model path {resolved} does not exist")
    ops = kernel_ops(kernels) if target.type == "cpu" and dtype == "float32" else None
    bar = _Bar(f"loading {resolved.name}", progress)
    weights: Mapping[str, Weight]
    try:
        if resolved.is_dir():
            config, weights, tokenizer = load_safetensors_folder(resolved, DTYPES[dtype], bar)
        elif resolved.suffix == ".gguf":
            config, weights, tokenizer = load_gguf(resolved, DTYPES[dtype], bar, keep_quantized=ops is not None)
        else:
            raise ModelLoadError(f"{resolved} is neither a .gguf file nor a model folder")
    finally:
        bar.close()
    model = LlamaModel(config, weights, device=target, ops=ops)
    del weights
    _return_freed_memory()
    return LoadedModel(config=config, model=model, tokenizer=tokenizer, path=resolved)
