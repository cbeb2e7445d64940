"""Where the model runs: auto (the first CUDA device when torch sees one, else the CPU), cpu,
cuda (the current CUDA device) or cuda:N. The one spelling rule, shared by Settings,
EngineConfig and the loader (models/device.py resolves a name against the devices this process
can see)."""

from __future__ import annotations

import re

DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def is_device_name(name: str) -> bool:
    return _DEVICE_RE.fullmatch(name) is not None
