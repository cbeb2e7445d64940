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

from sluice.engine.block_pool import BlockPool
from sluice.engine.hashing import extend_hashes
from sluice.engine.kv_manager import KVCacheManager
from sluice.engine.request import Request
from sluice.types import GenerationRequest, SamplingParams

BLOCK = 4
NUM_BLOCKS = 24
_ids = itertools.count()


def make_request(tokens: list[int], tenant: str) -> Request:
    return Request.from_generation_request(GenerationRequest(f"q{next(_ids)}", tokens, SamplingParams(), tenant=tenant), seed=0)


# A tiny alphabet and a few shared heads make prefix hits (and so shared blocks) common.
HEADS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7]]
prompts = st.tuples(st.sampled_from(HEADS + [[]]), st.lists(st.integers(1, 3), min_size=1, max_size=14)).map(
    lambda t: t[0] + t[1]
)


class KVMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
        self.live: dict[str, Request] = {}

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
        free_before = self.kv.num_free_blocks
        if self.kv.allocate(req, len(tokens) - hit.num_tokens, hit):
            req.num_computed_tokens = len(tokens)
            req.num_cached_tokens = hit.num_tokens
            self.live[req.request_id] = req
        else:
            assert self.kv.num_free_blocks == free_before  # a failed allocation changes nothing
            assert req.request_id not in self.kv.tables

    @precondition(lambda self: self.live)
    @rule(data=st.data(), k=st.integers(1, 6))
    def append(self, data: st.DataObject, k: int) -> None:
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        new = data.draw(st.lists(st.integers(1, 3), min_size=k, max_size=k))
        req.all_token_ids.extend(new)
        if self.kv.allocate(req, k):
            req.num_computed_tokens += k
        else:
            del req.all_token_ids[-k:]  # the step could not be scheduled: nothing happened

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        req = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        table = self.kv.tables[req.request_id]
        exclusive_tail_first = [b for b in reversed(table) if b.ref_cnt == 1]
        self.kv.free(req)
        free_list = list(self.kv.pool.free)
        # LRU: the freed request's blocks enter the free list's tail, tail block first
        assert free_list[len(free_list) - len(exclusive_tail_first):] == exclusive_tail_first

    @rule()
    def reset(self) -> None:
        self.kv.reset_prefix_cache()
        assert all(b.block_hash is None for b in self.kv.pool.free)

    # -- invariants --------------------------------------------------------------------------------
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
    def cache_entries_are_consistent(self) -> None:
        for h, block in self.kv.pool.cached.items():
            assert block.block_hash == h
        for req in self.live.values():
            assert len(self.kv.tables[req.request_id]) == -(-req.num_computed_tokens // BLOCK)
            for i, block in enumerate(self.kv.tables[req.request_id][: req.num_computed_tokens // BLOCK]):
                if block.block_hash is not None:  # a held block still carries this request's chain
                    assert block.block_hash == req.block_hashes[i]


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
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
