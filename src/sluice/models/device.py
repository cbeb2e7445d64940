"""Which torch device a `device` setting names, checked against what this process can see.

`auto` is the current CUDA device when torch sees one, else the CPU: a GPU host serves from its
GPU without a setting, and a CPU host (or a CPU-only torch build) is never asked for CUDA.
`cuda` / `cuda:N` are explicit, so a missing GPU is a start-up error that names the setting,
never a silent fall back to the CPU (an operator who asked for a GPU would otherwise get a
server many times slower than planned and no hint why) and never a CUDA traceback.
"""

from __future__ import annotations

import torch

from sluice.config import DEVICE_NAMES, SettingsError, is_device_name


def resolve_device(name: str | torch.device) -> torch.device:
    """The torch device for a setting value; raises SettingsError naming the setting."""
    if isinstance(name, torch.device):
        name = str(name)
    if not is_device_name(name):
        raise SettingsError(f"device: {name!r} is not a device: use {DEVICE_NAMES}")
    if name == "cpu":
        return torch.device("cpu")
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())
    if not torch.cuda.is_available():
        build = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise SettingsError(
            f"device = {name!r} (setting `device`, flag --device): {build} "
            "(torch.cuda.is_available() is False); use --device cpu or --device auto"
        )
    index = int(name.partition(":")[2] or torch.cuda.current_device())
    count = torch.cuda.device_count()
    if index >= count:
        raise SettingsError(
            f"device = {name!r} (setting `device`, flag --device): this machine has {count} CUDA "
            f"device(s), cuda:0 to cuda:{count - 1}"
        )
    return torch.device("cuda", index)
