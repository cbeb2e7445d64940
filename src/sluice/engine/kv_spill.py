"""The prefix cache's second tier: K/V blocks the engine gives back at rest, kept in a file.

After a burst the engine returns its KV memory once it has sat idle (BlockPool.shrink,
kv_memory.release_slots). Without this tier the prefix cache of finished requests survives only
in the `kv_idle_gib` it keeps resident: 64 MiB the process holds for good, for the next turn of
a chat that may never come. With it, the blocks' bytes go to a file instead, and every KV page
is given back. The page cache keeps the file's pages while memory is plentiful, and the kernel
writes them out and drops them when it is not: reclaimable memory, not the worker's own. A later
request whose prefix hashes are here reads them back into fresh blocks instead of recomputing
them: a 1,400-token chat history is ~64 MB copied, against seconds of prefill on a CPU. vLLM's
CPU offloading, SGLang's HiCache and LMCache's local-disk backend are this tier.

Entries are keyed by the prefix cache's chained hash (engine/hashing.py). It names the whole
prefix and its tenant namespace, so the tier keeps the cache's isolation: one tenant never reads
another's blocks. Bytes are copied, never converted, so a restored block is the block that was
computed (exact numerics stay exact). The file has no name (O_TMPFILE, or unlinked at once):
nothing to leak, nothing left behind by a crash. It holds fixed slots of one block each; when it
is full, the least recently used entry's slot is reused.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from sluice.engine.config import EngineConfig

log = logging.getLogger(__name__)

# file systems whose pages are memory that only swap can free: a spill there saves nothing
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def filesystem_type(directory: Path) -> str | None:
    """The type of the file system holding `directory` (Linux: /proc/self/mounts), or None."""
    try:
        target = directory.resolve()
        best, kind = "", None
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) < 3:
                continue
            mount = fields[1].replace("\\040", " ")
            if (target == Path(mount) or Path(mount) in target.parents) and len(mount) >= len(best):
                best, kind = mount, fields[2]
        return kind
    except OSError:
        return None


class KVSpillStore:
    """Fixed-size slots of `bytes_per_block` bytes in an unnamed file, at most `capacity_bytes`,
    keyed by block hash. Not thread-safe: the engine's thread is its only user."""

    def __init__(self, directory: str | os.PathLike[str], capacity_bytes: int, bytes_per_block: int):
        if bytes_per_block <= 0:
            raise ValueError("bytes_per_block must be > 0")
        self.capacity = capacity_bytes // bytes_per_block
        if self.capacity < 1:
            raise ValueError(
                f"kv_spill_gib holds no KV block ({capacity_bytes} bytes < one block of {bytes_per_block})"
            )
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ValueError(f"kv_spill_dir {str(self.directory)!r} is not a directory")
        self.bytes_per_block = bytes_per_block
        self._file = tempfile.TemporaryFile(dir=self.directory)
        self._fd = self._file.fileno()
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # hash -> slot, least recently used first
        self._next_slot = 0  # slots [_next_slot, capacity) were never written
        self._free: list[int] = []  # slots whose write failed: they hold nothing
        self.blocks_written = 0
        self.blocks_read = 0
        kind = filesystem_type(self.directory)
        if kind in _MEMORY_FILESYSTEMS:
            log.warning(
                "kv_spill_dir %s is on %s: spilled KV stays in memory; point it at a disk", self.directory, kind
            )

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._slots

    @property
    def closed(self) -> bool:
        return self._file.closed

    def chain(self, hashes: Sequence[bytes]) -> int:
        """How many of `hashes`, from the first, are here (a prefix lookup's continuation)."""
        n = 0
        for h in hashes:
            if h not in self._slots:
                break
            n += 1
        return n

    def put(self, hashes: Sequence[bytes], data: torch.Tensor) -> int:
        """Store block i's bytes `data[i]` (uint8, one row per block) under hashes[i]; a hash
        already here is only marked recent (same hash, same bytes). Returns the blocks written.
        A write that fails (a full disk) forgets what it was writing and raises OSError."""
        if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != self.bytes_per_block:
            raise ValueError(f"spill data must be uint8 rows of {self.bytes_per_block} bytes, got {tuple(data.shape)}")
        rows = data.contiguous().numpy()
        written = 0
        for i, h in enumerate(hashes):
            if h in self._slots:
                self._slots.move_to_end(h)
                continue
            slot = self._claim()
            try:
                n = os.pwrite(self._fd, rows[i].data, slot * self.bytes_per_block)
                if n != self.bytes_per_block:
                    raise OSError(f"short write to the KV spill file ({n} of {self.bytes_per_block} bytes)")
            except OSError:
                self._release(slot)
                raise
            self._slots[h] = slot
            written += 1
        self.blocks_written += written
        return written

    def get(self, hashes: Sequence[bytes], out: torch.Tensor | None = None) -> torch.Tensor:
        """The bytes of the blocks under `hashes` (each must be here), one uint8 row per block,
        in `out` (a buffer of at least that many rows) or a new tensor; they become the most
        recently used. Raises OSError if the file cannot be read."""
        out = torch.empty((len(hashes), self.bytes_per_block), dtype=torch.uint8) if out is None else out[: len(hashes)]
        rows = out.numpy()
        for i, h in enumerate(hashes):
            slot = self._slots[h]
            n = os.preadv(self._fd, [rows[i].data], slot * self.bytes_per_block)
            if n != self.bytes_per_block:
                raise OSError(f"short read from the KV spill file ({n} of {self.bytes_per_block} bytes)")
            self._slots.move_to_end(h)
        self.blocks_read += len(hashes)
        return out

    def touch(self, block_hash: bytes) -> None:
        """Make an entry the most recently used."""
        self._slots.move_to_end(block_hash)

    def clear(self) -> int:
        """Forget every entry (the weights changed) and give the file's space back; the count."""
        n = len(self._slots)
        self._slots.clear()
        self._free.clear()
        self._next_slot = 0
        if not self.closed:
            os.ftruncate(self._fd, 0)
        return n

    def close(self) -> None:
        """Close the file; the store is empty from then on (no lookup finds anything)."""
        self._slots.clear()
        self._file.close()

    def _claim(self) -> int:
        if self._free:
            return self._free.pop()
        if self._next_slot < self.capacity:
            self._next_slot += 1
            return self._next_slot - 1
        _, slot = self._slots.popitem(last=False)  # the least recently used entry goes
        return slot

    def _release(self, slot: int) -> None:
        self._free.append(slot)


class BlockCopier(Protocol):
    """What holds the KV tensors (engine/runner.py): whole blocks' bytes out and in."""

    def read_blocks(self, block_ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor: ...

    def write_blocks(self, block_ids: list[int], data: torch.Tensor) -> None: ...


# blocks copied per write: bounds the transient copy (16 blocks of the bundled model: 5.6 MiB)
_SPILL_BATCH = 16


class KVSpillTier:
    """A store wired to one engine's KV tensors: what the KV manager calls. A write that fails
    (a full disk) turns the tier off with one warning: the cache is then what it was without it
    (blocks given back are forgotten), never wrong. A read that fails turns it off too, and the
    request that wanted those blocks computes them."""

    def __init__(self, store: KVSpillStore, copier: BlockCopier):
        self.store = store
        self.copier = copier
        self.restored_blocks = 0

    @property
    def enabled(self) -> bool:
        return not self.store.closed

    def chain(self, hashes: Sequence[bytes]) -> int:
        return self.store.chain(hashes)  # 0 once the tier is off: a closed store is empty

    def spill(self, block_ids: list[int], hashes: list[bytes]) -> int:
        """Copy blocks about to be given back into the store; the blocks written."""
        fresh: list[tuple[int, bytes]] = []
        for block_id, h in zip(block_ids, hashes):
            if h in self.store:
                self.store.touch(h)  # given back again: same hash, same bytes, nothing to copy
            else:
                fresh.append((block_id, h))
        written = 0
        buffer = self._buffer(len(fresh))
        try:
            for i in range(0, len(fresh), _SPILL_BATCH):
                batch = fresh[i : i + _SPILL_BATCH]
                data = self.copier.read_blocks([b for b, _ in batch], buffer)
                written += self.store.put([h for _, h in batch], data)
        except OSError as e:
            self._disable("write", e)
        return written

    def restore(self, block_ids: list[int], hashes: list[bytes]) -> bool:
        """Read the blocks under `hashes` into `block_ids`; False (the tier off) if it failed."""
        buffer = self._buffer(len(hashes))
        for i in range(0, len(hashes), _SPILL_BATCH):
            try:
                data = self.store.get(hashes[i : i + _SPILL_BATCH], buffer)
            except (OSError, KeyError) as e:
                self._disable("read", e)
                return False
            self.copier.write_blocks(block_ids[i : i + _SPILL_BATCH], data)
        self.restored_blocks += len(block_ids)
        return True

    def _buffer(self, blocks: int) -> torch.Tensor:
        """Staging rows for one batch, reused by every batch of a call (its pages fault in once)."""
        return torch.empty((min(blocks, _SPILL_BATCH), self.store.bytes_per_block), dtype=torch.uint8)

    def clear(self) -> int:
        return self.store.clear()

    def _disable(self, what: str, error: Exception) -> None:
        log.warning(
            "KV spill %s failed (%s): the spill tier is off, prefix-cache entries given back are dropped", what, error
        )
        self.store.close()


def open_spill_tier(
    config: EngineConfig, bytes_per_block: int, copier: BlockCopier, device: torch.device
) -> KVSpillTier | None:
    """The engine's spill tier, or None where there is none: kv_spill_gib 0, no prefix cache, no
    idle budget (kv_idle_gib None: nothing is given back), or a CUDA pool (never given back). A
    kv_spill_dir that cannot hold the file stops start-up with an error naming it."""
    if (
        not (config.kv_spill_gib and config.enable_prefix_caching and config.kv_idle_gib is not None)
        or device.type != "cpu"
    ):
        return None
    directory = config.kv_spill_dir or tempfile.gettempdir()
    try:
        store = KVSpillStore(directory, int(config.kv_spill_gib * 2**30), bytes_per_block)
    except OSError as e:
        raise ValueError(f"kv_spill_dir {directory!r}: cannot create the KV spill file there ({e})") from e
    log.info("KV spill tier: up to %.2f GiB in an unnamed file in %s", config.kv_spill_gib, directory)
    return KVSpillTier(store, copier)
