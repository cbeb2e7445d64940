"""KV pool memory: how many blocks the pool gets, and tensors that cost nothing until written.

Sizing (first that applies): `num_kv_blocks`; `kv_cache_gib`; otherwise what the engine can
use at most, `max_num_seqs` requests of the full context, capped at `kv_memory_fraction` of the
memory available at start-up (MemAvailable, or the cgroup's headroom if lower; on a GPU, its free
memory after the weights loaded). The pool is a ceiling, not a cost: on CPU its tensors are
anonymous private mappings, so the kernel supplies zero pages on first touch and a block's
memory becomes resident only when K/V is first written to it. BlockPool decides which blocks get
touched (peak held + kv_idle_gib at most). Start-up no longer zero-fills gigabytes.

Why zeros at all: the portable torch attention reads slots that were never written — padding
points at the null block, and a request's last block is read past its context — and masks them
with -inf. The mask only works if those values are finite (0 × NaN is NaN in the softmax · V
product), so the pool must start as zeros everywhere, not just in the null block; untouched
anonymous pages read as zeros for free. On CUDA there is no lazy touch; zero-filling device
memory is fast.

Memory a burst touched goes back the same way: `release_slots` drops the pages of a range of
slots (madvise MADV_DONTNEED: the kernel frees them, and they read as zeros again, as if never
written), once the block pool has turned those blocks back into never-used ones (BlockPool.shrink).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import math
import mmap
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.engine.config import EngineConfig
from sluice.models.kernels import KVCacheDtype
from sluice.models.llama import LlamaModel

GIB = 2**30


class PoolSizing(enum.StrEnum):
    BLOCKS = "num_kv_blocks"
    GIB = "kv_cache_gib"
    SEQS_X_CONTEXT = "max_num_seqs x context"
    MEMORY_SHARE = "kv_memory_fraction of available memory"


@dataclass(slots=True)
class KVPoolPlan:
    num_blocks: int  # including the null block
    bytes_per_block: int
    max_idle_blocks: int | None
    sized_by: PoolSizing

    @property
    def reserved_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


def kv_bytes_per_block(model: LlamaModel, block_size: int, kv_dtype: torch.dtype | None = None) -> int:
    """`kv_dtype`: what the cache stores (default: the model's dtype)."""
    cfg = model.config
    itemsize = (kv_dtype or model.dtype).itemsize
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * block_size * itemsize  # K and V


def kv_cache_dtype(choice: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the KV cache stores for EngineConfig.kv_cache_dtype (one place)."""
    return torch.float16 if KVCacheDtype(choice) is KVCacheDtype.FLOAT16 else model_dtype


def plan_kv_pool(
    config: EngineConfig, bytes_per_block: int, context_len: int, available_bytes: Callable[[], int]
) -> KVPoolPlan:
    """`available_bytes` is called only when the pool is sized automatically."""
    idle = None if config.kv_idle_gib is None else int(config.kv_idle_gib * GIB) // bytes_per_block
    if config.num_kv_blocks is not None:
        return KVPoolPlan(config.num_kv_blocks, bytes_per_block, idle, PoolSizing.BLOCKS)
    if config.kv_cache_gib is not None:
        return KVPoolPlan(
            max(2, int(config.kv_cache_gib * GIB) // bytes_per_block), bytes_per_block, idle, PoolSizing.GIB
        )
    want = config.max_num_seqs * math.ceil(context_len / config.block_size) + 1
    cap = max(2, int(config.kv_memory_fraction * available_bytes()) // bytes_per_block)
    if want <= cap:
        return KVPoolPlan(want, bytes_per_block, idle, PoolSizing.SEQS_X_CONTEXT)
    return KVPoolPlan(cap, bytes_per_block, idle, PoolSizing.MEMORY_SHARE)


def available_memory(device: torch.device) -> int:
    """Bytes this process could still get: free device memory, or host memory within limits."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    candidates = [v for v in (_meminfo_available(), _cgroup_headroom()) if v is not None]
    if candidates:
        return min(candidates)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_headroom() -> int | None:
    """limit - usage of this process's cgroup (v2, or the v1 memory controller), if limited."""
    try:
        rel = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit_file, usage_file = base / "memory.max", base / "memory.current"
        if not limit_file.exists():
            base = Path("/sys/fs/cgroup/memory")
            limit_file, usage_file = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        limit = limit_file.read_text().strip()
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "unlimited" as a huge number
            return None
        return max(0, int(limit) - int(usage_file.read_text()))
    except (OSError, StopIteration, ValueError):
        return None


def lazy_zeros(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor whose memory is resident only where it has been written (CPU)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.zeros(tuple(shape), dtype=dtype, device=device)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        # with transparent huge pages on "always", one written slot would make 2 MiB resident
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(buf, dtype=dtype).view(tuple(shape))  # the tensor keeps `buf` alive


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # the same on every Linux architecture; mmap.MADV_DONTNEED where Python has it


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


# Linux only: there MADV_DONTNEED frees a private anonymous page at once and it reads as zeros
# afterwards; elsewhere the advice may leave the old contents (and the memory) in place
_madvise = _libc_madvise() if sys.platform.startswith("linux") else None


def release_slots(cache: torch.Tensor, first: int, end: int) -> int:
    """Drop the resident pages of slots [first, end) of a lazily zeroed KV tensor shaped (heads,
    slots, head_dim): they read as zeros afterwards. Only whole pages inside the range go (a page
    shared with slot first - 1 stays), so what other slots hold is never touched; the range's end
    is rounded up, as the caller guarantees slots from `end` on are unwritten. Returns the bytes
    released (on CUDA, or without madvise: 0)."""
    if cache.device.type != "cpu" or _madvise is None or end <= first or cache.dim() != 3:
        return 0
    row = cache.stride(1) * cache.element_size()  # bytes per slot in one head's plane
    plane = cache.stride(0) * cache.element_size()
    released = 0
    for head in range(cache.shape[0]):
        base = cache.data_ptr() + head * plane
        lo = -(-(base + first * row) // _PAGE) * _PAGE
        hi = min(-(-(base + end * row) // _PAGE) * _PAGE, base + plane - (base + plane) % _PAGE)
        if hi > lo and _madvise(lo, hi - lo, _MADV_DONTNEED) == 0:
            released += hi - lo
    return released
