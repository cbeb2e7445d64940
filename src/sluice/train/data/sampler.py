"""Which rows each rank trains on at each step: a pure function of (seed, step, world size).

The run reads an endless stream of rows: epoch e is a permutation of all rows drawn from
`seed + e`; global sample k is row perm_{k // rows}[k % rows]. Step s takes samples
[s·B, (s+1)·B) for the global batch B, and rank r of W takes its contiguous B/W of them. So the
loader's position is one number (the step), a resumed run — on any world size — reads exactly
the rows the uninterrupted run would have, mid-epoch included, and the global batch of a step
is the same set of rows whatever the number of ranks (the trainer slices a rank's share from the
global batch: train/trainer.py, parallel/dims.py's data_rank).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4)
def _permutation(rows: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(rows)


def global_batch(rows: int, seed: int, step: int, batch: int) -> list[int]:
    """Row indices of step `step`'s global batch, in order."""
    out = []
    for k in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(k, rows)
        out.append(int(_permutation(rows, seed, epoch)[pos]))
    return out


def epoch_of(rows: int, step: int, batch: int) -> float:
    return step * batch / rows
