"""The prefix cache's spill tier (engine/kv_spill.py): blocks given back at rest are kept in a
file and read back, byte for byte, by a later prefix hit; tenants stay apart; a failing file turns
the tier off without a wrong answer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.engine.kv_memory import kv_bytes_per_block
from sluice.engine.kv_spill import KVSpillStore, filesystem_type, open_spill_tier
from sluice.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def rows(n: int, width: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


# -- the store ------------------------------------------------------------------------------------
def test_store_round_trips_bytes_and_reuses_the_least_recently_used_slot(tmp_path: Path):
    store = KVSpillStore(tmp_path, capacity_bytes=3 * 64, bytes_per_block=64)
    assert store.capacity == 3 and list(tmp_path.iterdir()) == []  # the file has no name
    data = rows(3, 64, 0)
    assert store.put([b"a", b"b", b"c"], data) == 3
    assert torch.equal(store.get([b"c", b"a"]), data[[2, 0]])  # "b" is now the least recent
    assert store.put([b"a", b"d"], rows(2, 64, 1)[1:].repeat(2, 1)) == 1  # "a" is there: not rewritten
    assert b"b" not in store and len(store) == 3
    assert torch.equal(store.get([b"a"]), data[[0]])
    assert store.chain([b"a", b"c", b"x", b"d"]) == 2  # a lookup's run stops at the first miss
    assert store.clear() == 3 and len(store) == 0 and store.chain([b"a"]) == 0


def test_store_refuses_what_it_cannot_hold(tmp_path: Path):
    with pytest.raises(ValueError, match="holds no KV block"):
        KVSpillStore(tmp_path, capacity_bytes=10, bytes_per_block=64)
    with pytest.raises(ValueError, match="not a directory"):
        KVSpillStore(tmp_path / "missing", capacity_bytes=640, bytes_per_block=64)
    store = KVSpillStore(tmp_path, capacity_bytes=640, bytes_per_block=64)
    with pytest.raises(ValueError, match="uint8 rows of 64"):
        store.put([b"a"], torch.zeros(1, 32, dtype=torch.uint8))


def test_a_missing_spill_dir_stops_start_up_naming_it(tmp_path: Path):
    config = EngineConfig(kv_spill_dir=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="kv_spill_dir"):
        open_spill_tier(config, 64, copier=None, device=torch.device("cpu"))  # type: ignore[arg-type]
    assert open_spill_tier(EngineConfig(kv_spill_gib=0), 64, None, torch.device("cpu")) is None  # type: ignore[arg-type]
    assert open_spill_tier(EngineConfig(kv_idle_gib=None), 64, None, torch.device("cpu")) is None  # type: ignore[arg-type]


def test_filesystem_type_reads_the_mount_table(tmp_path: Path):
    if not Path("/proc/self/mounts").exists():
        pytest.skip("no /proc/self/mounts (not Linux)")
    assert filesystem_type(tmp_path) is not None
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        assert filesystem_type(shm) == "tmpfs"


# -- the engine -----------------------------------------------------------------------------------
def spill_engine(tiny_llama, tmp_path: Path, **kw) -> LLMEngine:
    config: dict[str, Any] = dict(block_size=4, num_kv_blocks=200, kv_idle_gib=1.0, kv_spill_dir=str(tmp_path))
    return LLMEngine(tiny_llama, EngineConfig(**(config | kw)))


def given_back(engine: LLMEngine) -> None:
    """What the pages given back read as (zeros), everywhere: a tiny model's blocks share pages
    with the null block, which the release keeps, so the test clears them itself."""
    for kv in engine.runner.kv_caches:
        for t in kv:
            t[:, engine.config.block_size :].zero_()


def test_runner_block_bytes_round_trip(tiny_llama, tmp_path: Path):
    engine = spill_engine(tiny_llama, tmp_path)
    engine.generate([GenerationRequest("r", list(range(3, 23)), GREEDY)])
    data = engine.runner.read_blocks([2, 4])
    assert data.shape == (2, kv_bytes_per_block(tiny_llama.model, 4))
    engine.runner.write_blocks([7, 9], data)
    assert torch.equal(engine.runner.read_blocks([7, 9]), data)
    assert not torch.equal(engine.runner.read_blocks([2]), engine.runner.read_blocks([4]))


def test_blocks_given_back_at_rest_come_back_from_the_spill_tier_with_the_same_output(tiny_llama, tmp_path: Path):
    prompt = [3 + (i * 7) % 50 for i in range(70)]  # 17 full blocks to read back: more than one batch
    plain = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=200, enable_prefix_caching=False))
    expected = plain.generate([GenerationRequest("p", prompt + [9, 10], GREEDY)])["p"].token_ids

    engine = spill_engine(tiny_llama, tmp_path)
    engine.generate([GenerationRequest("a", prompt, GREEDY)])
    assert engine.stats().kv_blocks_resident > 0
    assert engine.release_idle_memory() > 0
    s = engine.stats()
    assert s.kv_blocks_resident == 0  # everything given back, though kv_idle_gib would keep it
    assert s.kv_spilled_blocks == (len(prompt) + GREEDY.max_tokens - 1) // 4  # every full block
    given_back(engine)

    out = engine.generate([GenerationRequest("b", prompt + [9, 10], GREEDY)])["b"]
    assert out.usage.cached_tokens == 68  # 17 full blocks of the prompt, read back from the file
    assert out.token_ids == expected  # the bytes restored are the bytes computed
    s = engine.stats()
    assert s.kv_spill_restored_blocks == 17 and s.prefix_cache_hits == 68

    # another tenant's identical prompt finds nothing: the hashes carry the tenant's namespace
    other = engine.generate([GenerationRequest("c", prompt + [9, 10], GREEDY, tenant="other")])["c"]
    assert other.usage.cached_tokens == 0 and other.token_ids == expected

    # weights changing forget both tiers
    engine.release_idle_memory()
    assert engine.kv.reset_prefix_cache() > 0 and engine.stats().kv_spilled_blocks == 0
    again = engine.generate([GenerationRequest("d", prompt + [9, 10], GREEDY)])["d"]
    assert again.usage.cached_tokens == 0 and again.token_ids == expected


def test_without_the_tier_the_idle_budget_stays_resident(tiny_llama, tmp_path: Path):
    engine = spill_engine(tiny_llama, tmp_path, kv_spill_gib=0)
    prompt = list(range(3, 33))
    engine.generate([GenerationRequest("a", prompt, GREEDY)])
    engine.release_idle_memory()
    assert engine.stats().kv_blocks_resident > 0 and engine.stats().kv_spilled_blocks == 0
    out = engine.generate([GenerationRequest("b", prompt + [5], GREEDY)])["b"]
    assert out.usage.cached_tokens == 28  # from the resident cache


def test_a_failing_spill_file_turns_the_tier_off_and_the_request_computes(
    tiny_llama, tmp_path: Path, caplog, monkeypatch
):
    prompt = [3 + (i * 5) % 40 for i in range(30)]
    engine = spill_engine(tiny_llama, tmp_path)
    expected = engine.generate([GenerationRequest("a", prompt + [7], GREEDY)])["a"].token_ids
    engine.release_idle_memory()
    assert engine.stats().kv_spilled_blocks > 0
    given_back(engine)
    tier = engine.kv.spill
    assert tier is not None

    def unreadable(hashes, out=None):
        raise OSError(5, "Input/output error")  # the disk under the file failed

    monkeypatch.setattr(tier.store, "get", unreadable)
    out = engine.generate([GenerationRequest("b", prompt + [7], GREEDY)])["b"]
    assert out.error is None and out.token_ids == expected
    assert out.usage.cached_tokens == 0  # computed, not read
    assert not tier.enabled and "spill tier is off" in caplog.text
    engine.release_idle_memory()  # and a later rest keeps working without it
    assert engine.stats().kv_spilled_blocks == 0


def test_a_full_spill_file_keeps_a_chains_ancestors(tiny_llama, tmp_path: Path):
    """A rest that gives back more than the file holds writes in the pool's eviction order: the
    chain's deepest blocks first, its root last, so the file's LRU keeps the prefix (a chain is
    read from its root: without the root nothing of it is ever hit again)."""
    per_block = kv_bytes_per_block(tiny_llama.model, 4)
    engine = spill_engine(tiny_llama, tmp_path, kv_spill_gib=3 * per_block / 2**30)
    prompt = [3 + (i * 11) % 60 for i in range(25)]
    engine.generate([GenerationRequest("a", prompt, GREEDY)])
    engine.release_idle_memory()
    assert engine.stats().kv_spilled_blocks == 3  # of the 7 given back
    given_back(engine)
    out = engine.generate([GenerationRequest("b", prompt, GREEDY)])["b"]
    assert out.usage.cached_tokens == 12  # blocks 0-2 of the chain, read back
