"""KV blocks, the free list that doubles as LRU eviction order, and the prefix-cache map.

Every block with ref_cnt 0 sits in one doubly linked free list, cached or not, so "free space"
and "eviction candidates" are the same structure and every operation is O(1) without allocating:
- allocation pops from the head; a popped block that still carries a hash is evicted then;
- a prefix hit on a free block unlinks it from the middle (`touch`);
- released blocks are appended at the tail, a request's blocks tail-first, so a prefix chain's
  deepest block is evicted before its ancestors (an ancestor is needed by every descendant).
Block 0 is never handed out: it is a null block that padding may point at.

Resident memory follows use. The KV tensors are touched lazily (engine/kv_memory.py), so a
block costs memory from the first time it is handed out. Never-used blocks sit at the head of
the free list, in id order, ahead of every released block (release appends at the tail, and a
never-used block carries no hash, so no prefix hit unlinks it). With `max_idle` set, a
never-used block is handed out only while fewer than `max_idle` used blocks sit free; otherwise
the oldest used free block (right behind the never-used run) is taken. Resident blocks thus
never exceed the peak number held at once + max_idle, and the prefix cache of finished requests
lives in those max_idle blocks. max_idle=None: never-used first, always (the cache keeps all).

That bounds what a burst leaves behind by its peak, not by the budget: after 32 streams every
block they held stays resident. `shrink()` (the engine calls it when it has sat idle) turns the
top of the resident range back into never-used blocks: every block from the returned id up is
free, their cache entries are dropped, and the caller releases their memory (the runner's
`release_kv`). It lowers the watermark to just above the highest held block, or to where
max_idle used free blocks remain below it, whichever is higher. Ids, not recency, decide which
cache entries survive: the memory of a range of block ids is contiguous, their recency is not.
"""

from __future__ import annotations

from collections.abc import Iterator


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Intrusive doubly linked list through KVBlock.prev_free/next_free, with sentinels."""

    def __init__(self, blocks: list[KVBlock]):
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def appendleft(self, block: KVBlock) -> None:
        first = self._head.next_free
        assert first is not None
        self._head.next_free = block
        block.prev_free = self._head
        block.next_free = first
        first.prev_free = block
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free list")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def first(self) -> KVBlock | None:
        node = self._head.next_free
        return None if node is self._tail else node

    def popleft(self) -> KVBlock:
        first = self._head.next_free
        if first is None or first is self._tail:
            raise IndexError("no free KV blocks")
        self.remove(first)
        return first

    def __iter__(self) -> Iterator[KVBlock]:
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free

    def __len__(self) -> int:
        return self.num_free


class BlockPool:
    def __init__(self, num_blocks: int, max_idle: int | None = None):
        if num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks (block 0 is reserved)")
        if max_idle is not None and max_idle < 0:
            raise ValueError("max_idle must be >= 0")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # pinned: never free, never allocated
        self.free = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[bytes, KVBlock] = {}
        self.num_evictions = 0
        self.max_idle = max_idle
        self._next_unused = 1  # blocks [_next_unused, num_blocks) were never handed out

    @property
    def num_usable(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free(self) -> int:
        return self.free.num_free

    @property
    def num_never_used(self) -> int:
        return len(self.blocks) - self._next_unused

    @property
    def num_resident(self) -> int:
        """Blocks handed out at least once (their memory has been written)."""
        return self._next_unused - 1

    def _take(self) -> KVBlock:
        never_used = self.num_never_used
        used_free = self.free.num_free - never_used
        over_idle = self.max_idle is not None and used_free >= self.max_idle
        if never_used and not (used_free and over_idle):
            self._next_unused += 1
            return self.free.popleft()  # the head is the lowest never-used block
        # the oldest used free block: the head, or right behind the never-used run (whose last
        # block is the pool's last block while any is left)
        block = self.blocks[-1].next_free if never_used else self.free.first()
        assert block is not None
        self.free.remove(block)
        return block

    def allocate(self, n: int) -> list[KVBlock]:
        if n > self.free.num_free:
            raise MemoryError(f"asked for {n} KV blocks, {self.free.num_free} free")
        out = []
        for _ in range(n):
            block = self._take()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVBlock) -> None:
        if self.cached.get(block.block_hash) is block:  # type: ignore[arg-type]
            del self.cached[block.block_hash]  # type: ignore[arg-type]
        block.block_hash = None
        self.num_evictions += 1

    def uncache(self, block: KVBlock) -> None:
        """Drop `block`'s prefix-cache entry (its K/V was never written); it stays allocated."""
        if block.block_hash is not None:
            self._evict(block)

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cached blocks (a prefix hit); free ones leave the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free.remove(block)
            block.ref_cnt += 1

    def release(self, blocks: list[KVBlock]) -> None:
        """Drop one reference on each block, in the given (eviction) order."""
        for block in blocks:
            if block.ref_cnt <= 0 or block is self.null_block:
                raise RuntimeError(f"double free of {block}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free.append(block)

    def shrink(self, keep: int | None = None) -> int | None:
        """Return the free top of the resident range to never-used; the first id returned, or
        None if nothing is. Blocks [returned, old num_resident + 1) then hold no data anyone
        reads again (their cache entries are gone), so their memory can be released. `keep`:
        used free blocks to leave resident (default max_idle; 0 when a spill tier holds them)."""
        if self.max_idle is None:
            return None
        budget = self.max_idle if keep is None else keep
        top = self._next_unused
        # the watermark: above the highest held block, and with at most `budget` used free blocks
        # below it (walking down from the top, stop at a held block or when the rest fit)
        used_free = self.free.num_free - self.num_never_used
        low = top
        while low > 1 and used_free > budget:
            block = self.blocks[low - 1]
            if block.ref_cnt:
                break
            low -= 1
            used_free -= 1
        if low == top:
            return None
        for block_id in range(top - 1, low - 1, -1):  # to the head in id order, before the never-used run
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._evict(block)
            self.free.remove(block)
            self.free.appendleft(block)
        self._next_unused = low
        return low

    def used_free(self) -> Iterator[KVBlock]:
        """Free blocks that have held data, in eviction order (the never-used run skipped)."""
        node = self.blocks[-1].next_free if self.num_never_used else self.free.first()
        while node is not None and node.block_id >= 0:  # the tail sentinel's id is -1
            yield node
            node = node.next_free

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)

    def cache(self, block: KVBlock, block_hash: bytes) -> None:
        """Register a full block under its chain hash. An existing entry wins (no dedup), so
        block tables never change under a running request."""
        if block.block_hash is not None:
            return
        if block_hash not in self.cached:
            self.cached[block_hash] = block
            block.block_hash = block_hash

    def reset_cache(self) -> int:
        """Forget every cached hash of free blocks (e.g. after weights change). Returns count."""
        n = 0
        for block in self.free:
            if block.block_hash is not None:
                self._evict(block)
                n += 1
        return n
