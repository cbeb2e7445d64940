"""Settings: the model served, the fleet that serves it, and its local workers' lifecycle."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from sluice.config.device import DEVICE_NAMES, is_device_name


class ModelSection(BaseModel):
    model: str | None = None  # .gguf file or HF folder; default: the bundled SmolLM2
    served_model_name: str | None = None  # the id clients send; default: derived from the model
    model_aliases: list[str] = Field(default_factory=list)  # extra ids accepted for the model
    # fp32 is exact (greedy output equals transformers'); bfloat16 / float16 halve weight and KV
    # memory and are meant for GPUs (on CPU the kernels run fp32 only: other dtypes take torch)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # DEVICE_NAMES; a CUDA device that is not there stops start-up
    worker: str | None = None  # address of a running `sluice worker`; unset = spawn one locally
    # a fleet file (docs/FLEET.md): models, versions, workers; unset = a fleet of one model
    # built from the settings above (model, served_model_name, model_aliases, worker)
    fleet: str | None = None
    # without a fleet file: scale the spawned worker with the local autoscaler (docs/FLEET.md:
    # one serving worker, one in the warm pool, at most autoscale_max_workers); a fleet file
    # says it per version instead
    autoscale: bool = False
    autoscale_max_workers: int = Field(2, ge=1)
    worker_start_timeout_s: float = Field(180.0, gt=0)
    # a spawned worker that dies is restarted (backoff 1 s, 2 s, 4 s … 30 s); after more than
    # worker_max_restarts exits within worker_restart_window_s, serve exits with code 3
    worker_max_restarts: int = Field(5, ge=0)
    worker_restart_window_s: float = Field(600.0, gt=0)
    health_check_interval_s: float = Field(1.0, gt=0)  # how often the engine's health is probed
    health_check_timeout_s: float = Field(2.0, gt=0)  # a probe unanswered this long = engine down (hung)
    # a worker's fault injection (worker/faults.py): a testing aid, off by default
    fault_injection: str | None = None

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        if not is_device_name(v):
            raise ValueError(f"{v!r} is not a device: use {DEVICE_NAMES}")
        return v
