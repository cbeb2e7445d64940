"""The scheduler's view of KV memory: per-request block tables over the shared BlockPool.

Allocation is lazy: a request holds blocks for the tokens computed so far plus those scheduled
this step, never for its whole future (admission policy decides how much headroom to demand).
A block becomes a prefix-cache entry as soon as it is full of known tokens; lookups walk the
request's chained hashes and stop at the first miss, and never cover the last prompt token
(its logits must be computed). With a spill tier (engine/kv_spill.py) a lookup goes on past the
resident blocks into the blocks given back at rest, which `allocate` reads into fresh blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.engine.block_pool import BlockPool, KVBlock
from sluice.engine.hashing import extend_hashes
from sluice.engine.request import Request

if TYPE_CHECKING:  # the gateway imports this module (prefix_namespace) and must not load torch
    from sluice.engine.kv_spill import KVSpillTier


def prefix_namespace(tenant: str, share_across_tenants: bool = False, adapter: str = "") -> str:
    """The namespace a request's cached prefix blocks are hashed in: its tenant's own, so one
    tenant never hits (or times) another's prompt, unless the version shares prefixes across
    tenants; and its LoRA adapter's (`adapter`: the engine passes the adapter's name, source and
    files' fingerprint, engine/adapters.py), so K/V computed under one adapter is never reused
    for another or for the base model. The router's prefix affinity hashes in the same
    namespace (routing/dispatch; for an adapter, its name and source)."""
    tenant_part = "" if share_across_tenants else tenant
    return f"{tenant_part}\0lora\0{adapter}" if adapter else tenant_part


@dataclass(slots=True)
class PrefixHit:
    blocks: list[KVBlock]  # resident
    num_tokens: int  # the resident blocks' tokens and the spilled ones'
    spilled: list[bytes] = field(default_factory=list)  # hashes of the blocks after them, in the spill tier

    @property
    def num_evictable(self) -> int:
        """Hit blocks that currently sit in the free list (taking them shrinks free space)."""
        return sum(1 for b in self.blocks if b.ref_cnt == 0)


NO_HIT = PrefixHit([], 0)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        share_across_tenants: bool = False,
        max_idle_blocks: int | None = None,
    ):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, max_idle_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.share_across_tenants = share_across_tenants
        self.tables: dict[str, list[KVBlock]] = {}
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found
        # the blocks given back at rest, kept in a file (set by the engine once its tensors exist)
        self.spill: KVSpillTier | None = None

    # -- sizing -------------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable

    @property
    def num_resident_blocks(self) -> int:
        return self.pool.num_resident

    def spill_counts(self) -> tuple[int, int]:
        """(blocks in the spill tier, blocks read back from it so far)."""
        if self.spill is None:
            return 0, 0
        return len(self.spill.store), self.spill.restored_blocks

    def num_held_blocks(self, request: Request) -> int:
        return len(self.tables.get(request.request_id, ()))

    def _salt(self, request: Request) -> str:
        return prefix_namespace(request.tenant, self.share_across_tenants, request.adapter_namespace)

    # -- prefix cache ---------------------------------------------------------------------------
    def find_prefix(self, request: Request) -> PrefixHit:
        """Longest cached prefix of a request that holds no blocks yet."""
        if not self.enable_prefix_caching or request.prompt_logprobs is not None:
            return NO_HIT  # prompt logprobs need every prompt position's logits computed
        extend_hashes(request.block_hashes, request.all_token_ids, self.block_size, self._salt(request))
        # The last token is always recomputed: its logits start generation.
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[KVBlock] = []
        for h in request.block_hashes[:max_blocks]:
            block = self.pool.lookup(h)
            if block is None:
                break
            blocks.append(block)
        spilled: list[bytes] = []
        if self.spill is not None and len(blocks) < max_blocks:
            rest = request.block_hashes[len(blocks) : max_blocks]
            spilled = rest[: self.spill.chain(rest)]
        return PrefixHit(blocks, (len(blocks) + len(spilled)) * self.block_size, spilled)

    def record_lookup(self, request: Request, hit: PrefixHit) -> None:
        """Count a lookup once, when its request is admitted (not each time it is peeked at)."""
        self.prefix_queries += request.num_tokens
        self.prefix_hits += hit.num_tokens

    def num_exclusive_blocks(self, request: Request) -> int:
        """Blocks that preempting `request` would return to the free list."""
        return sum(1 for b in self.tables.get(request.request_id, ()) if b.ref_cnt == 1)

    # -- allocation ---------------------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT, reserve: int = 0) -> bool:
        total = request.num_computed_tokens + hit.num_tokens + num_new_tokens
        needed = self.blocks_for(total) - self.num_held_blocks(request) - len(hit.blocks)
        return needed + hit.num_evictable + reserve <= self.pool.num_free

    def allocate(self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """Give `request` blocks for `num_new_tokens` more tokens (after the prefix hit, if any).

        Returns False, changing nothing, when the pool cannot supply them.
        """
        if not self.can_allocate(request, num_new_tokens, hit):
            return False
        table = self.tables.setdefault(request.request_id, [])
        if hit.blocks:
            self.pool.touch(hit.blocks)
            table.extend(hit.blocks)
        total = request.num_computed_tokens + hit.num_tokens + num_new_tokens
        fresh = self.pool.allocate(self.blocks_for(total) - len(table))
        if hit.spilled and not self._restore(fresh[: len(hit.spilled)], hit.spilled):
            # the tier failed (and is off now): undo, and the next schedule looks up without it
            self.pool.release(list(reversed(fresh)))
            self.pool.release(list(reversed(hit.blocks)))
            del self.tables[request.request_id]
            return False
        table.extend(fresh)
        if self.enable_prefix_caching:
            self._cache_full_blocks(request, table, request.num_computed_tokens + hit.num_tokens, total)
        return True

    def _restore(self, blocks: list[KVBlock], hashes: list[bytes]) -> bool:
        """Read spilled blocks into fresh ones and make them cache entries again."""
        assert self.spill is not None
        if not self.spill.restore([b.block_id for b in blocks], hashes):
            return False
        for block, h in zip(blocks, hashes):
            self.pool.cache(block, h)
        return True

    def _cache_full_blocks(self, request: Request, table: list[KVBlock], start: int, end: int) -> None:
        # Tokens scheduled this step are known already, so their blocks are registered now and a
        # request admitted later in the same step may hit them: attention backends write the
        # whole step's K/V of a layer before any query of that layer reads (AttentionBackend).
        extend_hashes(request.block_hashes, request.all_token_ids, self.block_size, self._salt(request))
        full = min(end // self.block_size, len(request.block_hashes))
        for i in range(start // self.block_size, full):
            if table[i].block_hash is None:
                self.pool.cache(table[i], request.block_hashes[i])

    def cache_computed(self, request: Request, start: int) -> None:
        """Register the blocks from token `start` on that are now full of known, computed tokens.
        A speculative decode computes its proposals before they are known, so a block it filled
        was not full of known tokens when scheduled, and only becomes a cache entry here."""
        table = self.tables.get(request.request_id)
        if table and self.enable_prefix_caching:
            self._cache_full_blocks(request, table, start, request.num_computed_tokens)

    def free(self, request: Request) -> None:
        """Release every block of a finished, aborted or preempted request, tail first.

        `_cache_full_blocks` registers a block when its tokens are *scheduled*. A request freed
        before that step's forward completes (preempted as a victim later in the same schedule()
        call, or failed with its step) leaves blocks whose K/V was never written; their cache
        entries are dropped here, or a later prefix hit would attend to garbage. The request's
        `num_computed_tokens` still counts only the tokens actually computed at that point.
        """
        table = self.tables.pop(request.request_id, None)
        if table:
            for block in table[request.num_computed_tokens // self.block_size :]:
                self.pool.uncache(block)
            self.pool.release(list(reversed(table)))

    def block_ids(self, request: Request) -> list[int]:
        return [b.block_id for b in self.tables.get(request.request_id, ())]

    def shrink(self) -> tuple[int, int] | None:
        """Block ids [first, end) whose memory may be released (BlockPool.shrink), or None. With
        a spill tier every used free block goes, its cache entry copied to the tier first."""
        end = self.pool.num_resident + 1
        spill = self.spill if self.spill is not None and self.spill.enabled else None
        if spill is None:
            first = self.pool.shrink()
            return None if first is None else (first, end)
        # in eviction order, so that the spill file's LRU keeps what the pool would have kept
        # longest (a chain's ancestors, the most recent) when one rest gives back more than it holds
        cached = [(b.block_id, b.block_hash) for b in self.pool.used_free() if b.block_hash is not None]
        first = self.pool.shrink(keep=0)
        if first is None:
            return None
        dropped = [(i, h) for i, h in cached if i >= first]
        spill.spill([i for i, _ in dropped], [h for _, h in dropped])
        return first, end

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix of free blocks, and the spill tier's (the weights changed)."""
        return self.pool.reset_cache() + (self.spill.clear() if self.spill is not None else 0)
