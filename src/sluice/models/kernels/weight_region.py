"""The packed weights of a model in one memory region on 2 MiB pages.

A decode step streams every weight once (~96 MB for the bundled model), far more than the
TLB covers with 4 KiB pages (Zen 3's 2,048 L2 entries map 8 MB), so each of its ~24,000 pages costs
a page walk per step. Gathered into one region that asks for transparent huge pages
(`madvise(MADV_HUGEPAGE)`: the default THP mode, `madvise`, gives them only to regions that ask),
the same weights span ~48 pages: one stream's step took 0.95x the time on one core and 0.93x on
two (bench/kernels/weight_pages.py: medians of four alternating pairs of processes; docs/BENCHMARKS.md,
"Weights on huge pages"). Where the kernel gives no huge pages (THP `never`) the region is
ordinary memory and nothing else changes.

Each weight keeps its own contiguous, 64-byte-aligned tensor (a view into the region), so the
kernels see no difference; the region lives as long as the views (they hold the mmap).
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterable

import torch

from sluice.models.kernels.packed_linear import PackedLinear

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each weight starts on a cache line, as the allocator placed it before


def _aligned(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def gather_on_huge_pages(linears: Iterable[PackedLinear]) -> int:
    """Move the packed tensors of `linears` (each once, however often listed) into one region that
    asks for huge pages; returns the region's size in bytes (0 when there is nothing to move)."""
    unique = list({id(lin): lin for lin in linears}.values())
    total = sum(_aligned(lin.packed.numel(), ALIGN) for lin in unique)
    if total == 0:
        return 0
    # An anonymous mapping is page-aligned, not huge-page-aligned: map one huge page more and start
    # at the first 2 MiB boundary inside it. Private: a shared anonymous mapping is shmem, whose huge
    # pages a separate setting (shmem_enabled, usually `never`) governs.
    region = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError) as exc:  # a kernel built without THP
        log.debug("no huge pages for the weights (%s)", exc)
    buf = torch.frombuffer(region, dtype=torch.uint8)
    off = -buf.data_ptr() % HUGE_PAGE
    for lin in unique:
        n = lin.packed.numel()
        view = buf[off : off + n]
        view.copy_(lin.packed.view(-1))  # first touch: the pages fault in huge where allowed
        lin.packed = view.view(lin.packed.shape)
        off += _aligned(n, ALIGN)
    return total
