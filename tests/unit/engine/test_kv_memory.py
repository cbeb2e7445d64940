"""KV pool memory: sizing, lazily touched tensors, and resident blocks bounded by use.

Resident memory is read from /proc/self/status (Linux): page accounting, not timing, so the
figures are the same on a busy machine.
"""

from __future__ import annotations

import gc
import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, rule

import tests.unit.engine.test_block_pool as block_pool_tests
from sluice.engine.block_pool import BlockPool
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.engine.kv_manager import KVCacheManager
from sluice.engine.kv_memory import GIB, PoolSizing, kv_bytes_per_block, lazy_zeros, plan_kv_pool, release_slots
from sluice.types import GenerationRequest, SamplingParams

MIB = 2**20
needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="resident memory is read from /proc (Linux)"
)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# -- sizing -----------------------------------------------------------------------------------------
def no_probe() -> int:
    raise AssertionError("available memory is read only for automatic sizing")


def test_explicit_sizes_win_and_never_probe_memory():
    per = 1000
    plan = plan_kv_pool(EngineConfig(num_kv_blocks=10, kv_cache_gib=1.0), per, 4096, no_probe)
    assert (plan.num_blocks, plan.sized_by) == (10, PoolSizing.BLOCKS)
    plan = plan_kv_pool(EngineConfig(kv_cache_gib=0.5), per, 4096, no_probe)
    assert (plan.num_blocks, plan.sized_by) == (GIB // 2 // per, PoolSizing.GIB)


def test_auto_size_is_what_max_num_seqs_times_the_context_can_use():
    config = EngineConfig(block_size=8, max_num_seqs=4)
    plan = plan_kv_pool(config, 1000, 100, lambda: 10**12)
    assert plan.sized_by is PoolSizing.SEQS_X_CONTEXT
    assert plan.num_blocks == 4 * 13 + 1  # ceil(100 / 8) blocks per sequence, plus the null block


def test_auto_size_is_capped_at_a_share_of_available_memory():
    config = EngineConfig(block_size=8, max_num_seqs=64, kv_memory_fraction=0.5)
    plan = plan_kv_pool(config, 1000, 8192, lambda: 2_000_000)
    assert (plan.num_blocks, plan.sized_by) == (1000, PoolSizing.MEMORY_SHARE)


def test_idle_budget_in_blocks():
    assert (
        plan_kv_pool(EngineConfig(num_kv_blocks=10, kv_idle_gib=0.001), 1000, 64, no_probe).max_idle_blocks
        == int(0.001 * GIB) // 1000
    )
    assert plan_kv_pool(EngineConfig(num_kv_blocks=10, kv_idle_gib=None), 1000, 64, no_probe).max_idle_blocks is None


# -- lazily touched tensors ---------------------------------------------------------------------------
@needs_proc
def test_lazy_zeros_reads_as_zeros_and_costs_memory_only_where_written():
    gc.collect()
    before = rss_bytes()
    t = lazy_zeros((4, 256 * MIB // 16, 4), torch.float32, torch.device("cpu"))  # 1 GiB
    assert float(t.abs().max()) == 0.0  # every byte reads as zero (finite: -inf masking relies on it)
    assert rss_bytes() - before < 64 * MIB  # a full read maps no memory
    t[:, : 4 * MIB // 16].fill_(1.0)  # write 4 x 4 MiB
    grown = rss_bytes() - before
    assert 15 * MIB < grown < 64 * MIB
    assert float(t.sum()) == 4 * (4 * MIB // 16) * 4
    del t
    gc.collect()
    assert rss_bytes() - before < 8 * MIB  # unmapped with the tensor


def test_lazy_zeros_keeps_dtype_and_shape():
    t = lazy_zeros((2, 3, 5), torch.bfloat16, torch.device("cpu"))
    assert t.dtype is torch.bfloat16 and t.shape == (2, 3, 5) and not t.any()
    t[1, 2, 4] = 3.0
    assert float(t.sum()) == 3.0


@needs_proc
def test_building_an_engine_touches_no_kv_memory(tiny_llama):
    gc.collect()
    before = rss_bytes()
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, kv_cache_gib=1.0))
    per_block = kv_bytes_per_block(tiny_llama.model, 4)
    assert engine.kv.num_usable_blocks * per_block > 0.99 * GIB
    assert rss_bytes() - before < 64 * MIB
    for k, v in engine.runner.kv_caches:
        assert not k.any() and not v.any()  # zeros everywhere, not only in the null block
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.generate([GenerationRequest(f"r{i}", [3 + i] * 10, params) for i in range(3)])
    s = engine.stats()
    assert s.kv_blocks_resident == 3 * 5  # 18 tokens each in blocks of 4, and nothing more
    assert s.kv_resident_bytes == 15 * per_block


@needs_proc
def test_released_slots_read_as_zeros_and_leave_memory():
    t = lazy_zeros((2, 4096, 256), torch.float32, torch.device("cpu"))  # 2 planes of 4 MiB, 1 KiB a slot
    t.fill_(1.0)
    gc.collect()
    before = rss_bytes()
    released = release_slots(t, 3, 4096)  # slot 3 shares its page with slots 0-2: that page stays
    assert released == 2 * (4 * MIB - 4096)
    assert before - rss_bytes() > 7 * MIB
    assert float(t[:, :4].sum()) == 2 * 4 * 256  # the kept page's slots are intact
    assert float(t[:, 4:].abs().max()) == 0.0  # the rest reads as zeros, as if never written
    t[:, 100].fill_(2.0)  # and takes writes again
    assert float(t.sum()) == 2 * 4 * 256 + 2 * 2 * 256


def test_release_idle_memory_returns_kv_above_the_budget_and_outputs_stay_the_same(tiny_llama):
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=200, kv_idle_gib=0))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def run(tag: str) -> list[list[int]]:
        out = engine.generate([GenerationRequest(f"{tag}{i}", [3 + i] * 10, params) for i in range(3)])
        return [out[f"{tag}{i}"].token_ids for i in range(3)]

    first = run("a")
    assert engine.stats().kv_blocks_resident == 15
    per_block = kv_bytes_per_block(tiny_llama.model, 4)
    released = engine.release_idle_memory()
    assert engine.stats().kv_blocks_resident == 0  # kv_idle_gib 0: nothing kept for the cache
    assert 0 < released <= 15 * per_block  # whole pages only
    assert run("b") == first  # the same prompts after the release: the same greedy tokens
    assert engine.release_idle_memory() >= 0 and engine.stats().kv_blocks_resident == 0


def test_shrink_keeps_the_idle_budget_and_stops_at_a_held_block():
    kv = KVCacheManager(40, 4, enable_prefix_caching=False, max_idle_blocks=2)
    reqs = [block_pool_tests.make_request([5] * 8, "t") for _ in range(5)]
    for r in reqs:
        assert kv.allocate(r, 8)  # 2 blocks each: ids 1-10
    assert kv.num_resident_blocks == 10
    for r in reqs[:2] + reqs[3:]:
        kv.free(r)  # request 2 (blocks 5, 6) still runs
    assert kv.shrink() == (7, 11)  # down to the held block 6; 4 free used blocks remain below it
    assert kv.num_resident_blocks == 6
    kv.free(reqs[2])
    assert kv.shrink() == (3, 7)  # now down to the budget: blocks 1-2 stay for the cache
    assert kv.num_resident_blocks == 2 and kv.shrink() is None
    assert KVCacheManager(40, 4, max_idle_blocks=None).shrink() is None  # no budget: the cache keeps all


# -- resident blocks follow use -----------------------------------------------------------------------
def test_never_used_blocks_go_out_in_id_order_until_the_idle_budget_is_reached():
    pool = BlockPool(10, max_idle=2)
    a = pool.allocate(3)
    assert [b.block_id for b in a] == [1, 2, 3] and pool.num_resident == 3
    pool.release(list(reversed(a)))  # 3 used blocks free: over the budget of 2
    b = pool.allocate(2)
    assert [x.block_id for x in b] == [3, 2] and pool.num_resident == 3  # reused, oldest free first
    c = pool.allocate(2)
    assert [x.block_id for x in c] == [4, 5]  # 1 used block free, under the budget: new memory
    assert pool.num_resident == 5 and [x.block_id for x in pool.free][-1:] == [1]


def test_idle_budget_zero_reuses_before_touching_anything_new():
    pool = BlockPool(10, max_idle=0)
    a = pool.allocate(4)
    pool.release(a)
    assert [x.block_id for x in pool.allocate(4)] == [1, 2, 3, 4]
    assert [x.block_id for x in pool.allocate(2)] == [5, 6]  # nothing free to reuse: new memory
    assert pool.num_resident == 6


def test_cached_blocks_survive_while_the_idle_budget_has_room():
    tokens = list(range(1, 17))
    kv = KVCacheManager(40, 4, enable_prefix_caching=True, max_idle_blocks=8)
    first = block_pool_tests.make_request(tokens, "t")
    assert kv.allocate(first, len(tokens))
    first.num_computed_tokens = len(tokens)
    kv.free(first)  # 4 cached blocks free, under the budget of 8
    other = block_pool_tests.make_request([9] * 12, "t")
    assert kv.allocate(other, 12)  # takes new memory rather than evicting the cache
    again = block_pool_tests.make_request(tokens, "t")
    assert kv.find_prefix(again).num_tokens == 12  # the cached prefix is still there (last token recomputed)


class IdleBoundedKVMachine(block_pool_tests.KVMachine):
    """The KV manager state machine of test_block_pool, with an idle budget: every invariant
    there still holds, the shadow free list models the budgeted choice exactly, and resident
    blocks never exceed the peak held + the budget."""

    MAX_IDLE = 3

    def __init__(self) -> None:
        super().__init__()
        # request ids from a fresh counter per example: the rules pick requests by sorted id, so
        # ids that depend on earlier examples ("q9" < "q10" flips) make hypothesis replays differ
        block_pool_tests._ids = itertools.count()
        self.kv = KVCacheManager(
            block_pool_tests.NUM_BLOCKS,
            block_pool_tests.BLOCK,
            enable_prefix_caching=True,
            max_idle_blocks=self.MAX_IDLE,
        )
        self.handed_out: set[int] = set()
        self.peak_held = 0

    def _take_from_head(self, new_blocks) -> None:
        for block in new_blocks:
            never_used = sum(1 for b in self.lru if b not in self.handed_out)  # always the list's head run
            used_free = len(self.lru) - never_used
            if never_used and not (used_free and used_free >= self.MAX_IDLE):
                expected = self.lru[0]
            else:
                expected = self.lru[never_used]
            assert block.block_id == expected
            self.lru.remove(expected)
            self.handed_out.add(expected)
        held = self.kv.num_usable_blocks - self.kv.num_free_blocks
        self.peak_held = max(self.peak_held, held)

    @rule()
    def shrink(self) -> None:
        """The engine sat idle: the free top of the resident range becomes never-used again."""
        held = {b.block_id for t in self.kv.tables.values() for b in t}
        top = self.kv.num_resident_blocks + 1
        span = self.kv.shrink()
        if span is not None:
            first, end = span
            assert end == top and first < end
            released = set(range(first, end))
            assert not released & held  # only free blocks go
            self.lru = sorted(released) + [
                b for b in self.lru if b not in released
            ]  # the never-used head run, in id order
            self.handed_out -= released
            for key in [k for k in self.slots if k[0] in released]:
                del self.slots[key]  # their memory reads as zeros: a prefix hit on them would fail admit's check
        resident = self.kv.num_resident_blocks
        used_free = resident - len(held)
        # at most the budget stays free below the watermark, unless a held block pins it higher
        assert used_free <= self.MAX_IDLE or resident in held

    @invariant()
    def resident_is_bounded_by_use(self) -> None:
        assert self.kv.num_resident_blocks == len(self.handed_out)
        assert self.kv.num_resident_blocks <= self.peak_held + self.MAX_IDLE


TestIdleBoundedKVMachine = IdleBoundedKVMachine.TestCase
TestIdleBoundedKVMachine.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_the_async_loop_releases_memory_once_idle(tiny_llama, monkeypatch) -> None:
    """Wired: once idle after a burst, the loop calls release_idle_memory (idle_release_s=0: as
    soon as it is idle, no clock in the test) and the pool is back to the budget."""
    import asyncio
    import threading

    from sluice.engine.async_engine import AsyncEngine

    inner = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=200, kv_idle_gib=0))
    calls: list[int] = []
    released = threading.Event()
    real = inner.release_idle_memory

    def spy() -> int:
        calls.append(inner.stats().kv_blocks_resident)
        out = real()
        released.set()
        return out

    monkeypatch.setattr(inner, "release_idle_memory", spy)
    engine = AsyncEngine(inner, idle_release_s=0).start()
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def burst() -> None:
        async def one(i: int) -> None:
            async for _ in engine.generate(GenerationRequest(f"s{i}", [3 + i] * 10, params)):
                pass

        await asyncio.gather(*(one(i) for i in range(3)))

    try:
        assert released.wait(60)  # the load's own release, before any request
        released.clear()
        asyncio.run(burst())
        for _ in range(60):  # a bounded wait: each round ends at a release (or after 1 s)
            if engine.stats().kv_blocks_resident == 0:
                break
            released.wait(1)
            released.clear()
        assert engine.stats().kv_blocks_resident == 0  # kv_idle_gib 0: all of it went back
        assert max(calls[1:]) > 0  # released after the burst, with blocks resident then
    finally:
        engine.shutdown()
