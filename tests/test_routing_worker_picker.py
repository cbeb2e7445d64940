"""Worker choice: prefix affinity keyed like the prefix cache, held within the load bound."""

from __future__ import annotations

import random

import pytest

from sluice.engine.hashing import block_hash
from sluice.routing.errors import ModelUnavailableError
from sluice.routing.worker_picker import Candidate, PickReason, WorkerPicker, affinity_key, prefix_salt

BS = 8
SYSTEM = list(range(1000, 1040))  # 40 tokens = 5 full blocks shared by every prompt below


def prompt(tail_seed: int, shared=SYSTEM) -> list[int]:
    rng = random.Random(tail_seed)
    return shared + [rng.randrange(50_000) for _ in range(rng.randrange(1, 200))]


def workers(*loads: int) -> list[Candidate]:
    return [Candidate(f"w{i}", load) for i, load in enumerate(loads)]


def test_key_is_the_prefix_cache_hash_of_the_leading_blocks():
    p = prompt(1)
    h = None
    for i in range(4):
        h = block_hash(h, p[i * BS : (i + 1) * BS], "acme")
    assert affinity_key(p, BS, 4, prefix_salt("acme")) == h
    assert affinity_key(p[:20], BS, 4, "acme") == block_hash(block_hash(None, p[:8], "acme"), p[8:16])
    assert affinity_key(p[:7], BS, 4, "acme") is None  # no full block: no key


@pytest.mark.parametrize("share", [False, True])
def test_key_equals_the_engines_own_block_hash(share):
    # the engine's KV manager hashes the request's blocks for its prefix cache; the routing key
    # must be the same hash, with the same tenant rule, or affinity would aim at the wrong cache
    from sluice.engine.kv_manager import KVCacheManager
    from sluice.engine.request import Request
    from sluice.types import GenerationRequest

    p = prompt(5)
    kv = KVCacheManager(num_blocks=64, block_size=BS, share_across_tenants=share)
    req = Request.from_generation_request(GenerationRequest("r", p, tenant="acme"), seed=0)
    kv.find_prefix(req)
    assert affinity_key(p, BS, 4, prefix_salt("acme", share)) == req.block_hashes[3]


def test_tenants_are_namespaced_like_the_cache():
    p = prompt(1)
    assert affinity_key(p, BS, 4, prefix_salt("a")) != affinity_key(p, BS, 4, prefix_salt("b"))
    shared = prefix_salt("a", share_across_tenants=True)
    assert shared == prefix_salt("b", share_across_tenants=True) == ""


def test_shared_leading_blocks_go_to_the_same_worker():
    picker = WorkerPicker()
    pool = workers(0, 0, 0, 0)
    keys = {affinity_key(prompt(i), BS, 4, "t") for i in range(50)}
    assert len(keys) == 1  # the tails differ beyond the first 4 blocks
    picks = {picker.pick(pool, affinity_key(prompt(i), BS, 4, "t")).worker_id for i in range(50)}
    assert len(picks) == 1
    # other prefixes (other tenants, other system prompts) spread over all workers
    chosen = [picker.pick(pool, affinity_key(prompt(1), BS, 4, f"tenant-{t}")).worker_id for t in range(400)]
    counts = {w.worker_id: chosen.count(w.worker_id) for w in pool}
    assert min(counts.values()) >= 60, counts  # 100 each on average


def test_affinity_holds_within_the_bound_and_spills_past_it():
    picker = WorkerPicker(load_bound=1.25, slack_tokens=100)
    key = affinity_key(prompt(1), BS, 4, "t")
    order = [c.worker_id for c in picker.order(workers(0, 0, 0), key)]
    loads = {w: 0 for w in order}
    loads[order[1]] = loads[order[2]] = 1000
    # the first choice keeps the prefix while its load ≤ 1.25 × 1000 + 100 = 1350
    loads[order[0]] = 1350
    cands = [Candidate(w, load) for w, load in loads.items()]
    assert picker.pick(cands, key).worker_id == order[0]
    loads[order[0]] = 1351
    cands = [Candidate(w, load) for w, load in loads.items()]
    pick = picker.pick(cands, key)
    assert (pick.worker_id, pick.reason, pick.rank) == (order[1], PickReason.SPILL, 1)  # next in order


def test_a_hot_prefix_never_exceeds_the_bound():
    picker = WorkerPicker(load_bound=1.25, slack_tokens=256)
    loads = {f"w{i}": 0 for i in range(4)}
    key = affinity_key(prompt(7), BS, 4, "hot")
    order = [c.worker_id for c in picker.order(workers(0, 0, 0, 0), key)]
    used = []
    for _ in range(2000):
        cands = [Candidate(w, load) for w, load in loads.items()]
        pick = picker.pick(cands, key)
        assert loads[pick.worker_id] <= 1.25 * min(loads.values()) + 256
        used.append(pick.worker_id)
        loads[pick.worker_id] += 100  # each request adds 100 tokens of work, nothing finishes
    assert used[:3] == [order[0]] * 3  # affinity first
    assert set(used) == set(order)  # once all are busy, the load spreads
    assert max(loads.values()) <= 1.25 * min(loads.values()) + 256 + 100


def test_random_loads_respect_the_bound_and_prefer_the_first_choice():
    picker = WorkerPicker(load_bound=1.25, slack_tokens=512)
    rng = random.Random(3)
    for i in range(1000):
        cands = [Candidate(f"w{j}", rng.randrange(0, 20_000)) for j in range(rng.randrange(1, 8))]
        key = affinity_key(prompt(i), BS, 4, f"t{i}")
        pick = picker.pick(cands, key)
        bound = 1.25 * min(c.load_tokens for c in cands) + 512
        chosen = next(c for c in cands if c.worker_id == pick.worker_id)
        assert chosen.load_tokens <= bound
        first = picker.order(cands, key)[0]
        if first.load_tokens <= bound:
            assert pick.worker_id == first.worker_id and pick.reason is PickReason.AFFINITY


def test_removing_a_worker_moves_only_its_prefixes():
    picker = WorkerPicker()
    keys = [affinity_key(prompt(1), BS, 4, f"t{i}") for i in range(500)]
    four = workers(0, 0, 0, 0)
    before = {k: picker.pick(four, k).worker_id for k in keys}
    three = [c for c in four if c.worker_id != "w2"]
    after = {k: picker.pick(three, k).worker_id for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "w2")


def test_no_key_picks_the_least_loaded():
    pick = WorkerPicker().pick(workers(500, 20, 300), None)
    assert (pick.worker_id, pick.reason) == ("w1", PickReason.LEAST_LOADED)
    with pytest.raises(ModelUnavailableError):
        WorkerPicker().pick([], None)
    with pytest.raises(ValueError):
        WorkerPicker(load_bound=0.9)
