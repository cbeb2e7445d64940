"""Which rows of a step's global batch each replica group trains on, and their loss tokens.

Group g of G takes the g-th contiguous 1/G of the global batch (then its ranks split that as a
plain run's ranks split the whole): with all groups present the ranks together read exactly the
rows a plain run of the same nproc reads, in the same order."""

from __future__ import annotations

from sluice.train.data.dataset import PackedData
from sluice.train.step import trained_tokens


def group_rows(rows: list[int], groups: int, group: int) -> list[int]:
    per = len(rows) // groups
    return rows[group * per : (group + 1) * per]


def group_tokens(data: PackedData, rows: list[int], groups: int) -> list[int]:
    """Each group's trained tokens in this step's global batch."""
    return [trained_tokens(data, group_rows(rows, groups, g)) for g in range(groups)]
