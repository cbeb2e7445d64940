"""Settings: LoRA adapters on the served base model (docs/LORA.md). `lora_modules` registers
adapters at start (`sluice serve --lora-modules NAME=PATH ...`, vLLM's flag); the limits are the
engine's (EngineConfig: max_loras, max_cpu_loras, max_lora_rank) and travel to every worker."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from sluice.config.section import Section

# an adapter's name is a model id clients send (the fleet file's ModelId)
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")


def parse_lora_module(item: str) -> tuple[str, str]:
    """NAME=PATH (PATH: a PEFT adapter folder or s3://bucket/prefix) -> (name, path)."""
    name, sep, path = item.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not path:
        raise ValueError(f"{item!r}: expected NAME=PATH")
    if not ADAPTER_NAME.match(name):
        raise ValueError(f"{item!r}: the name must be letters, digits and . _ : / @ - (at most 128)")
    return name, path


class LoraSection(Section):
    lora_modules: list[str] = Field(default_factory=list)
    """LoRA adapters served on the base model from start-up: a request's `model` names one; PATH is a
    PEFT adapter folder or s3://bucket/prefix (env SLUICE_LORA_MODULES, a JSON list; docs/LORA.md)"""
    max_loras: int = Field(8, ge=0)
    """LoRA: distinct adapters running at once per worker; 0 = none"""
    max_cpu_loras: int = Field(16, ge=1)
    """LoRA: adapters kept loaded per worker, least recently used evicted"""
    max_lora_rank: int = Field(64, ge=1, le=1024)
    """LoRA: the largest rank loaded"""
    lora_s3_endpoint: str | None = None
    """LoRA: the S3-compatible endpoint of s3:// adapters (default: AWS_ENDPOINT_URL, else AWS)"""

    @field_validator("lora_modules")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        names = [parse_lora_module(item)[0] for item in v]
        if len(set(names)) != len(names):
            raise ValueError("an adapter name is given twice")
        return v
