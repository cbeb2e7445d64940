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


def pct(values: list[float], q: float) -> float:
    """The `q` quantile by nearest rank (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def log(msg: str = "") -> None:
    """Progress on stderr, so that stdout holds only the result (JSON)."""
    print(msg, file=sys.stderr, flush=True)
