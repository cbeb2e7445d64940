"""Read a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`) and check it
against the base model, so that a damaged or mismatched adapter is refused with one line naming
the file, tensor or field at fault, before anything serves it.

The tensors come back per (layer, target) as fp32 A [r, in] and B [out, r] with PEFT's scale;
bf16 and fp16 files widen exactly. Keys are PEFT's (`base_model.model.model.layers.3.self_attn.
q_proj.lora_A.weight`; an adapter-name infix like `.default` is accepted too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sluice.errors import AdapterError
from sluice.models.config import ModelConfig
from sluice.models.lora.adapter_config import TARGETS, LoraConfig, parse_adapter_config

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$"
)
_SECTION = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
_WIDEN = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(slots=True, frozen=True)
class LoraPair:
    """One targeted linear: y += scale · (x Aᵀ) Bᵀ, A [r, in], B [out, r] (fp32)."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(slots=True, frozen=True)
class AdapterTensors:
    config: LoraConfig
    pairs: dict[tuple[int, str], LoraPair]  # (layer, target) -> its A, B and scale
    file_bytes: int  # the safetensors file's size (the adapter's memory is close to it in fp32)

    @property
    def max_rank(self) -> int:
        return max(p.rank for p in self.pairs.values())


def linear_shape(cfg: ModelConfig, target: str) -> tuple[int, int]:
    """(out, in) of a decoder linear of the base model."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "q_proj": (q, cfg.hidden_size),
        "k_proj": (kv, cfg.hidden_size),
        "v_proj": (kv, cfg.hidden_size),
        "o_proj": (cfg.hidden_size, q),
        "gate_proj": (cfg.intermediate_size, cfg.hidden_size),
        "up_proj": (cfg.intermediate_size, cfg.hidden_size),
        "down_proj": (cfg.hidden_size, cfg.intermediate_size),
    }[target]


def read_adapter(folder: Path, base: ModelConfig, max_rank: int | None = None) -> AdapterTensors:
    """The folder's adapter, checked against `base`; AdapterError naming the problem otherwise.
    `max_rank`: the largest rank the server takes (None: any)."""
    if not folder.is_dir():
        raise AdapterError(f"adapter folder {folder} does not exist")
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file():
        raise AdapterError(f"{folder}: {CONFIG_FILE} is missing (a PEFT adapter folder has it and {WEIGHTS_FILE})")
    if not weights_path.is_file():
        extra = (
            " (a pickled adapter_model.bin is never loaded: save with safe_serialization=True)"
            if (folder / "adapter_model.bin").exists()
            else ""
        )
        raise AdapterError(f"{folder}: {WEIGHTS_FILE} is missing{extra}")
    try:
        config = parse_adapter_config(config_path.read_text(encoding="utf-8"), f"{folder.name}/{CONFIG_FILE}")
        size = weights_path.stat().st_size
    except (OSError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{folder}: cannot read the adapter ({type(exc).__name__}: {exc})") from None
    tensors = _load_safetensors(weights_path, f"{folder.name}/{WEIGHTS_FILE}")
    pairs = _pairs(tensors, config, base, f"{folder.name}/{WEIGHTS_FILE}")
    adapter = AdapterTensors(config, pairs, size)
    if max_rank is not None and adapter.max_rank > max_rank:
        raise AdapterError(f"{folder.name}: rank {adapter.max_rank} is above this server's max_lora_rank {max_rank}")
    return adapter


def _load_safetensors(path: Path, where: str) -> dict[str, torch.Tensor]:
    """Every tensor of the file (safe_open checks that the header covers the file exactly, so a
    truncated or padded file is refused)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, ValueError, RuntimeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AdapterError(f"{where}: not a readable safetensors file, truncated or damaged ({first})") from None


def _pairs(
    tensors: dict[str, torch.Tensor], config: LoraConfig, base: ModelConfig, where: str
) -> dict[tuple[int, str], LoraPair]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        target = m.group(3) if m else key.split(".lora_")[0].rsplit(".", 1)[-1]
        if m is None or target not in TARGETS or _SECTION[target] != m.group(2):
            raise AdapterError(
                f"{where}: tensor {key!r}: target module {target!r} is not a linear of this base "
                f"model (LoRA is served on {', '.join(TARGETS)})"
            )
        layer = int(m.group(1))
        if layer >= base.num_layers:
            raise AdapterError(f"{where}: tensor {key!r} is for layer {layer}; the base model has {base.num_layers}")
        if tensor.dtype not in _WIDEN:
            raise AdapterError(f"{where}: tensor {key!r} is {tensor.dtype}; expected float32, bfloat16 or float16")
        halves.setdefault((layer, target), {})[m.group(4)] = tensor
    if not halves:
        raise AdapterError(f"{where}: holds no LoRA weights")
    # numpy, single-threaded: torch.isfinite runs an OpenMP region per call, and on a busy machine
    # each waited for a second core (measured 30-70 ms of a ~70 ms load of the bundled model's 420
    # tensors, against ~3 ms here)
    bad = next((k for k, t in tensors.items() if not np.isfinite(t.to(torch.float32).numpy()).all()), None)
    if bad is not None:
        raise AdapterError(f"{where}: tensor {bad!r} holds non-finite values")
    pairs: dict[tuple[int, str], LoraPair] = {}
    for (layer, target), ab in sorted(halves.items()):
        pairs[(layer, target)] = _pair(ab, layer, target, config, base, where)
    return pairs


def _pair(
    ab: dict[str, torch.Tensor], layer: int, target: str, config: LoraConfig, base: ModelConfig, where: str
) -> LoraPair:
    section = _SECTION[target]
    name = f"model.layers.{layer}.{section}.{target}"
    if set(ab) != {"A", "B"}:
        missing = "lora_B" if "A" in ab else "lora_A"
        raise AdapterError(f"{where}: {name} has no {missing} weight")
    a, b = ab["A"], ab["B"]
    out_f, in_f = linear_shape(base, target)
    r = config.rank_of(name)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_f or b.shape[0] != out_f:
        raise AdapterError(
            f"{where}: {name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the "
            f"base model's {target} ({out_f} x {in_f}): expected lora_A ({r}, {in_f}) and "
            f"lora_B ({out_f}, {r})"
        )
    if a.shape[0] != r or b.shape[1] != r:
        raise AdapterError(
            f"{where}: {name}: rank mismatch: lora_A has rank {a.shape[0]}, lora_B {b.shape[1]}, "
            f"adapter_config.json says r = {r}"
        )
    return LoraPair(a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous(), config.scale_of(name))
