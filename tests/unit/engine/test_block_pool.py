"""The KV block manager under random operation sequences (hypothesis), plus unit checks.

A state machine drives KVCacheManager the way the scheduler does — admit with a prefix-cache
lookup, append tokens, free (finish/abort/preempt), reset the cache — over a tiny pool so that
eviction happens constantly, and checks after every step that no block leaks or is freed twice,
reference counts equal the number of live holders exactly, a held block is never on the free
list (so never evicted or handed out), the free list is LRU with freed tables entering tail
first, the null block is never handed out, and lookups stop at the first miss and never cover
the last prompt token.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluice.engine.block_pool import BlockPool, KVBlock
from sluice.engine.hashing import extend_hashes
from sluice.engine.kv_manager import KVCacheManager
from sluice.engine.request import Request
from sluice.types import GenerationRequest, SamplingParams

BLOCK = 4
NUM_BLOCKS = 24
_ids = itertools.count()


def make_request(tokens: list[int], tenant: str) -> Request:
    return Request.from_generation_request(
        GenerationRequest(f"q{next(_ids)}", tokens, SamplingParams(), tenant=tenant), seed=0
    )


# A tiny alphabet and a few shared heads make prefix hits (and so shared blocks) common.
HEADS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7]]
prompts = st.tuples(st.sampled_from(HEADS + [[]]), st.lists(st.integers(1, 3), min_size=1, max_size=14)).map(
    lambda t: t[0] + t[1]
)


class KVMachine(RuleBasedStateMachine):
    """KVCacheManager against two shadow models: the free list's exact LRU order, and what every
    KV slot holds (the tenant and token prefix it was computed for).

    Live requests are drawn in admission order, never by id: ids come from a module-wide counter
    that a replay does not rewind, and sorted ids change order when they gain a digit (q99, q100),
    which made Hypothesis's replays draw different requests (FlakyStrategyDefinition)."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
        self.live: dict[str, Request] = {}
        self.lru: list[int] = list(range(1, NUM_BLOCKS))  # expected free-list order, head first
        self.slots: dict[tuple[int, int], tuple[str, tuple[int, ...]]] = {}  # (block, offset) -> content
        self.chains: dict[bytes, tuple[str, tuple[int, ...]]] = {}  # block hash -> the prefix it names

    # -- shadow helpers -----------------------------------------------------------------------------
    def _remember_chain(self, req: Request) -> None:
        for i, h in enumerate(req.block_hashes):
            self.chains[h] = (req.tenant, tuple(req.all_token_ids[: (i + 1) * BLOCK]))

    def _take_from_head(self, new_blocks: list[KVBlock]) -> None:
        """Fresh blocks come off the free list's head, oldest first (LRU eviction)."""
        assert [b.block_id for b in new_blocks] == self.lru[: len(new_blocks)]
        del self.lru[: len(new_blocks)]

    def _compute(self, req: Request, start: int, end: int) -> None:
        """The forward pass writes K/V for positions [start, end) into the request's blocks."""
        table = self.kv.tables[req.request_id]
        for p in range(start, end):
            self.slots[(table[p // BLOCK].block_id, p % BLOCK)] = (req.tenant, tuple(req.all_token_ids[: p + 1]))
        req.num_computed_tokens = end

    # -- operations -------------------------------------------------------------------------------
    @rule(tokens=prompts, tenant=st.sampled_from(["a", "b"]))
    def admit(self, tokens: list[int], tenant: str) -> None:
        req = make_request(tokens, tenant)
        hit = self.kv.find_prefix(req)
        # lookups never cover the last prompt token, and stop at the first miss
        assert hit.num_tokens <= len(tokens) - 1
        assert hit.num_tokens == len(hit.blocks) * BLOCK
        for i, block in enumerate(hit.blocks):
            assert self.kv.pool.lookup(req.block_hashes[i]) is block
        if len(hit.blocks) < (len(tokens) - 1) // BLOCK:
            assert self.kv.pool.lookup(req.block_hashes[len(hit.blocks)]) is None
        # a hit serves exactly this tenant's K/V for exactly these tokens (never stale, never foreign)
        for p in range(hit.num_tokens):
            assert self.slots.get((hit.blocks[p // BLOCK].block_id, p % BLOCK)) == (tenant, tuple(tokens[: p + 1]))
        free_before = self.kv.num_free_blocks
        revived = [b.block_id for b in hit.blocks if b.ref_cnt == 0]  # leave the free list's middle
        if self.kv.allocate(req, len(tokens) - hit.num_tokens, hit):
            for block_id in revived:
                self.lru.remove(block_id)
            self._take_from_head(self.kv.tables[req.request_id][len(hit.blocks) :])
            self._remember_chain(req)
            req.num_cached_tokens = hit.num_tokens
            self.live[req.request_id] = req
            self._compute(req, hit.num_tokens, len(tokens))
        else:
            assert self.kv.num_free_blocks == free_before  # a failed allocation changes nothing
            assert req.request_id not in self.kv.tables

    @precondition(lambda self: self.live)
    @rule(data=st.data(), k=st.integers(1, 6), computed=st.booleans())
    def append(self, data: st.DataObject, k: int, computed: bool) -> None:
        """Schedule k more tokens. computed=False: the request is then freed before its forward
        ran (a preemption victim later in the same step, or a failed step)."""
        req = self.live[data.draw(st.sampled_from(list(self.live)))]
        new = data.draw(st.lists(st.integers(1, 3), min_size=k, max_size=k))
        req.all_token_ids.extend(new)
        held = self.kv.num_held_blocks(req)
        if self.kv.allocate(req, k):
            self._take_from_head(self.kv.tables[req.request_id][held:])
            self._remember_chain(req)
            if computed:
                self._compute(req, req.num_computed_tokens, req.num_computed_tokens + k)
            else:
                self._free(req)
        else:
            del req.all_token_ids[-k:]  # the step could not be scheduled: nothing happened

    def _free(self, req: Request) -> None:
        del self.live[req.request_id]
        table = self.kv.tables[req.request_id]
        exclusive_tail_first = [b.block_id for b in reversed(table) if b.ref_cnt == 1]
        self.kv.free(req)
        self.lru.extend(exclusive_tail_first)  # LRU: they enter at the tail, tail block first

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self._free(self.live[data.draw(st.sampled_from(list(self.live)))])

    @rule()
    def reset(self) -> None:
        self.kv.reset_prefix_cache()
        assert all(b.block_hash is None for b in self.kv.pool.free)

    # -- invariants --------------------------------------------------------------------------------
    @invariant()
    def free_list_is_the_lru_model(self) -> None:
        assert [b.block_id for b in self.kv.pool.free] == self.lru

    @invariant()
    def ref_counts_are_exact(self) -> None:
        holders: dict[int, int] = {}
        for table in self.kv.tables.values():
            for block in table:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        pool = self.kv.pool
        assert pool.null_block.ref_cnt == 1 and 0 not in holders  # the null block is never handed out
        for block in pool.blocks[1:]:
            assert block.ref_cnt == holders.get(block.block_id, 0), block

    @invariant()
    def no_leak_no_double_free(self) -> None:
        pool = self.kv.pool
        free_ids = [b.block_id for b in pool.free]
        assert len(free_ids) == len(set(free_ids)) == pool.num_free  # no block twice on the list
        held = {b.block_id for t in self.kv.tables.values() for b in t}
        assert not held & set(free_ids)  # a held block is never evictable
        assert len(held) + pool.num_free == pool.num_usable  # nothing leaked

    @invariant()
    def live_requests_keep_their_kv(self) -> None:
        """Nothing a live request holds was evicted, re-handed out or overwritten."""
        for req in self.live.values():
            table = self.kv.tables[req.request_id]
            assert len(table) == -(-req.num_computed_tokens // BLOCK)
            for p in range(req.num_computed_tokens):
                assert self.slots[(table[p // BLOCK].block_id, p % BLOCK)] == (
                    req.tenant,
                    tuple(req.all_token_ids[: p + 1]),
                )
            for i, block in enumerate(table[: req.num_computed_tokens // BLOCK]):
                if block.block_hash is not None:  # a held block still carries this request's chain
                    assert block.block_hash == req.block_hashes[i]

    @invariant()
    def cache_entries_are_consistent(self) -> None:
        """Every prefix-cache entry is backed by K/V actually computed for the prefix it names
        (so a block scheduled but freed before its forward ran is never served)."""
        for h, block in self.kv.pool.cached.items():
            assert block.block_hash == h and block.block_id != 0
            tenant, tokens = self.chains[h]
            for o in range(BLOCK):
                want = (tenant, tokens[: len(tokens) - BLOCK + o + 1])
                assert self.slots.get((block.block_id, o)) == want, f"{block} is cached but its K/V is not"


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_tenant_salt_separates_hashes():
    tokens = list(range(1, 17))
    a, b, a2 = make_request(tokens, "a"), make_request(tokens, "b"), make_request(tokens, "a")
    for r in (a, b, a2):
        extend_hashes(r.block_hashes, r.all_token_ids, BLOCK, r.tenant)
    assert a.block_hashes == a2.block_hashes
    assert not set(a.block_hashes) & set(b.block_hashes)  # the salt in block 0 changes every chained hash


def test_pool_errors_and_o1_free_list():
    pool = BlockPool(6)
    got = pool.allocate(5)
    assert [b.block_id for b in got] == [1, 2, 3, 4, 5] and pool.num_free == 0
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.release([got[2], got[0]])
    assert [b.block_id for b in pool.free] == [3, 1]
    pool.touch([got[2]])  # a prefix hit takes a free block out of the middle of the list
    assert [b.block_id for b in pool.free] == [1]
    with pytest.raises(RuntimeError):
        pool.release([got[0]])  # already free: a double free is refused
    with pytest.raises(RuntimeError):
        pool.release([pool.null_block])
    with pytest.raises(ValueError):
        BlockPool(1)


def admitted(kv: KVCacheManager, tokens: list[int], tenant: str = "a", computed: bool = True) -> Request:
    """Admit a request the way the scheduler does; computed=False stops before its forward."""
    req = make_request(tokens, tenant)
    hit = kv.find_prefix(req)
    assert kv.allocate(req, len(tokens) - hit.num_tokens, hit)
    req.num_cached_tokens = hit.num_tokens
    req.num_computed_tokens = len(tokens) if computed else hit.num_tokens
    return req


def test_eviction_takes_the_lru_block_and_lookups_stop_at_the_first_miss():
    kv = KVCacheManager(6, BLOCK)  # usable blocks 1..5
    a = admitted(kv, list(range(1, 10)))  # blocks 1, 2 full (cached), 3 partial
    assert kv.block_ids(a) == [1, 2, 3]
    kv.free(a)
    assert [b.block_id for b in kv.pool.free] == [4, 5, 3, 2, 1]  # tail first: deepest evicted first
    b = admitted(kv, [30 + i for i in range(13)])  # needs 4 blocks: evicts cached block 2, not 1
    assert kv.block_ids(b) == [4, 5, 3, 2] and kv.pool.num_evictions == 1
    again = make_request(list(range(1, 10)), "a")
    hit = kv.find_prefix(again)
    assert [blk.block_id for blk in hit.blocks] == [1] and hit.num_tokens == BLOCK  # stops at the miss


def test_blocks_freed_before_their_forward_are_not_cached():
    """Regression: a request preempted (or failed) in the step that scheduled its tokens left
    their blocks registered in the prefix cache although their K/V was never written."""
    kv = KVCacheManager(16, BLOCK)
    a = admitted(kv, list(range(1, 14)), computed=False)
    kv.free(a)
    assert kv.pool.cached == {} and all(blk.block_hash is None for blk in kv.pool.blocks)
    assert kv.find_prefix(make_request(list(range(1, 14)), "a")).num_tokens == 0
    # computed blocks stay cached: only the uncomputed tail loses its entries
    partly = admitted(kv, list(range(1, 14)), computed=False)
    partly.num_computed_tokens = 5  # the first block was computed in an earlier step
    kv.free(partly)
    assert kv.find_prefix(make_request(list(range(1, 14)), "a")).num_tokens == BLOCK


@pytest.mark.parametrize("share", [False, True])
def test_prefix_hits_are_namespaced_per_tenant(share):
    kv = KVCacheManager(32, BLOCK, share_across_tenants=share)
    tokens = list(range(1, 18))
    kv.free(admitted(kv, tokens, tenant="acme"))
    assert kv.find_prefix(make_request(tokens, "acme")).num_tokens == 16
    assert kv.find_prefix(make_request(tokens, "globex")).num_tokens == (16 if share else 0)
