"""The environment a replica group's torchrun and ranks are told which group they are and where
the Lighthouse is. Its own torch-free module: the launcher sets these before any rank starts,
and importing train/replica/sync.py there would cost the launcher a torch import (seconds
before torchrun even starts)."""

from __future__ import annotations

import os

GROUP_ENV = "SLUICE_REPLICA_GROUP"  # which replica group this torchrun is (0 .. replica_groups-1)
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own variable: the Lighthouse's http://HOST:PORT


def replica_group() -> int:
    return int(os.environ.get(GROUP_ENV, "0"))
