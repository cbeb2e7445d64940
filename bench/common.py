"""What the benchmarks of every system share: the repository's root, a percentile, a log line.

Each script puts the repository root on `sys.path` itself (it must, before it can import this)
and runs from the root with `PYTHONPATH=src`, as docs/BENCHMARKS.md's commands do:

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/<system>/x.py → the root
    from bench.common import log, pct

Shared within one system: bench/serving/fleet_common.py (fleet files, the admin API, streamed
requests), bench/serving/workloads.py (prompts), bench/kernels/paired_steps.py (paired decode
steps), bench/train/train_common.py (a random model folder, `sluice train run`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# the subjects of the served benchmarks' prompts (compare_serving, serve_load, vs_llamacpp): one
# list, so their figures stay comparable with each other and across runs
PROMPT_TOPICS = (
    "the sea", "a mountain", "bread", "trains", "owls", "rain", "chess", "a library",
    "copper", "tea", "bridges", "the moon", "gardens", "violins", "deserts", "bees",
)  # fmt: skip


def pct(values: list[float], q: float) -> float:
    """The `q` quantile by nearest rank (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def log(msg: str = "") -> None:
    """Progress on stderr, so that stdout holds only the result (JSON)."""
    print(msg, file=sys.stderr, flush=True)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_lora_adapter(folder: Path, cfg, rank: int = 16, seed: int = 0, std: float = 0.02) -> Path:
    """A random PEFT adapter folder (adapter_config.json + adapter_model.safetensors, PEFT's keys)
    of `rank` on every linear of a model (`cfg`: sluice's ModelConfig), fp32 as PEFT saves it:
    what the LoRA benchmarks load, without a download or PEFT at bench time."""
    import json

    import torch
    from safetensors.torch import save_file

    from sluice.models.lora.adapter_folder import linear_shape

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_layers):
        for t in LORA_TARGETS:
            out_f, in_f = linear_shape(cfg, t)
            section = "self_attn" if t in LORA_TARGETS[:4] else "mlp"
            key = f"base_model.model.model.layers.{layer}.{section}.{t}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * std
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": list(LORA_TARGETS),
                "bias": "none",
                "lora_dropout": 0.0,
            }
        )
    )
    return folder


def answers_200(url: str, timeout_s: float = 120.0) -> bool:
    """Poll `url` until it answers 200 (True) or `timeout_s` passes (False): a server the bench
    started is up. httpx is imported here, so that importing this module stays light."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
