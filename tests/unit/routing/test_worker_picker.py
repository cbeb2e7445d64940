"""Worker choice: prefix affinity keyed like the prefix cache, held within the load bound;
new prefixes placed where the fewest are (deterministic: no wall clock, an injected one)."""

from __future__ import annotations

import random

import pytest

from sluice.engine.hashing import block_hash
from sluice.engine.kv_manager import prefix_namespace as prefix_salt
from sluice.routing.dispatch.worker_picker import Candidate, PickReason, WorkerPicker, affinity_key
from sluice.routing.errors import ModelUnavailableError
from tests.clock import FakeClock

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
    first = picker.pick(workers(0, 0, 0), key)
    assert first.reason is PickReason.NEW_PREFIX
    home = first.worker_id
    loads = {c.worker_id: 1000 for c in workers(0, 0, 0)}
    # the prefix's worker keeps it while its load ≤ 1.25 × 1000 + 100 = 1350
    loads[home] = 1350
    pick = picker.pick([Candidate(w, load) for w, load in loads.items()], key)
    assert (pick.worker_id, pick.reason, pick.rank) == (home, PickReason.AFFINITY, 0)
    loads[home] = 1351
    pick = picker.pick([Candidate(w, load) for w, load in loads.items()], key)
    assert pick.worker_id != home and (pick.reason, pick.rank) == (PickReason.SPILL, 0 + 1)
    assert picker.holders(key) == [home, pick.worker_id]  # a second worker now holds it too
    # both hold it: the less loaded of them wins, the third worker stays out of it
    loads[home], loads[pick.worker_id] = 1000, 1200
    again = picker.pick([Candidate(w, load) for w, load in loads.items()], key)
    assert (again.worker_id, again.reason, again.rank) == (home, PickReason.AFFINITY, 0)


def test_eight_tenants_split_four_and_four_over_two_workers():
    # the benchmark's case: requests one at a time, so every worker is idle at each pick and
    # only the prefix count can balance the caches (a hash alone splits 8 keys unevenly)
    picker = WorkerPicker()
    pool = [Candidate("unix:/tmp/a/worker.sock", 0), Candidate("unix:/tmp/b/worker.sock", 0)]
    keys = [affinity_key(prompt(1), BS, 4, f"tenant-{t}") for t in "abcdefgh"]
    home = {k: picker.pick(pool, k) for k in keys}
    assert all(p.reason is PickReason.NEW_PREFIX for p in home.values())
    split = sorted(picker.prefix_groups().values())
    assert split == [4, 4]
    # sticky: later rounds, in any order, go to the same worker with the prefix's cache
    rng = random.Random(7)
    for _ in range(6):
        for k in rng.sample(keys, len(keys)):
            pick = picker.pick(pool, k)
            assert (pick.worker_id, pick.reason) == (home[k].worker_id, PickReason.AFFINITY)
    assert sorted(picker.prefix_groups().values()) == [4, 4] and len(picker) == 8


def test_placement_is_deterministic():
    keys = [affinity_key(prompt(1), BS, 4, f"t{i}") for i in range(40)]
    runs = []
    for _ in range(2):
        picker = WorkerPicker()
        runs.append([picker.pick(workers(0, 0, 0), k).worker_id for k in keys])
    assert runs[0] == runs[1]
    # the rendezvous order breaks the tie between equals: the first key goes to its first choice
    assert runs[0][0] == WorkerPicker().order(workers(0, 0, 0), keys[0])[0].worker_id


def test_a_new_prefix_goes_within_the_bound_to_the_fewest_prefixes():
    picker = WorkerPicker(load_bound=1.25, slack_tokens=0)
    for i in range(3):  # w0 holds three groups, w1 one, w2 none
        picker.pick([Candidate("w0", 0)], affinity_key(prompt(1), BS, 4, f"a{i}"))
    picker.pick([Candidate("w1", 0)], affinity_key(prompt(1), BS, 4, "b"))
    key = affinity_key(prompt(1), BS, 4, "new")
    # w2 has the fewest but is over the bound (1.25 × 1000): w1 is next
    pick = picker.pick([Candidate("w0", 1000), Candidate("w1", 1100), Candidate("w2", 1300)], key)
    assert (pick.worker_id, pick.reason) == ("w1", PickReason.NEW_PREFIX)


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


def test_random_loads_respect_the_bound_and_keep_known_prefixes():
    picker = WorkerPicker(load_bound=1.25, slack_tokens=512)
    rng = random.Random(3)
    keys = [affinity_key(prompt(i), BS, 4, f"t{i}") for i in range(50)]
    ids = [f"w{j}" for j in range(6)]
    for _ in range(2000):
        cands = [Candidate(w, rng.randrange(0, 20_000)) for w in rng.sample(ids, rng.randrange(1, 7))]
        key = rng.choice(keys)
        held = set(picker.holders(key))
        pick = picker.pick(cands, key)
        bound = 1.25 * min(c.load_tokens for c in cands) + 512
        chosen = next(c for c in cands if c.worker_id == pick.worker_id)
        assert chosen.load_tokens <= bound
        if any(c.worker_id in held and c.load_tokens <= bound for c in cands):
            assert pick.worker_id in held and pick.reason is PickReason.AFFINITY
        else:
            assert pick.reason is (PickReason.SPILL if held else PickReason.NEW_PREFIX)
    assert sum(picker.prefix_groups().values()) == sum(len(picker.holders(k)) for k in keys)


def test_removing_a_worker_moves_only_its_prefixes():
    picker = WorkerPicker()
    keys = [affinity_key(prompt(1), BS, 4, f"t{i}") for i in range(500)]
    four = workers(0, 0, 0, 0)
    before = {k: picker.pick(four, k).worker_id for k in keys}
    assert sorted(picker.prefix_groups().values()) == [125] * 4
    assert picker.forget("w2") == 125 and "w2" not in picker.prefix_groups()
    three = [c for c in four if c.worker_id != "w2"]
    after = {k: picker.pick(three, k) for k in keys}
    assert all(
        after[k].worker_id == before[k] and after[k].reason is PickReason.AFFINITY for k in keys if before[k] != "w2"
    )
    moved = [after[k] for k in keys if before[k] == "w2"]
    assert all(p.reason is PickReason.NEW_PREFIX for p in moved)  # forgotten, placed afresh
    assert sorted(picker.prefix_groups().values()) == [166, 167, 167]  # spread over the rest
    assert picker.forget("w2") == 0


def test_a_worker_that_is_only_skipped_keeps_its_prefixes():
    # a retry excludes a worker (or its breaker is open for a moment): that is not a lost
    # cache, so its prefixes come back to it once it is a candidate again
    picker = WorkerPicker()
    key = affinity_key(prompt(1), BS, 4, "t")
    home = picker.pick(workers(0, 0), key).worker_id
    other = [c for c in workers(0, 0) if c.worker_id != home]
    assert picker.pick(other, key).reason is PickReason.SPILL
    assert picker.pick(workers(0, 0), key).worker_id == home


def test_idle_prefixes_expire_and_the_table_is_bounded():
    clock = FakeClock()
    picker = WorkerPicker(max_prefixes=3, idle_ttl_s=60, clock=clock)
    keys = [affinity_key(prompt(1), BS, 4, f"t{i}") for i in range(4)]
    for k in keys[:3]:
        picker.pick(workers(0, 0), k)
        clock.t += 10
    picker.pick(workers(0, 0), keys[0])  # keys[0] is now the most recently used
    picker.pick(workers(0, 0), keys[3])  # over max_prefixes: the least recently used (keys[1]) goes
    assert len(picker) == 3 and picker.holders(keys[1]) == [] and picker.holders(keys[0])
    clock.t += 59  # keys[2] was last used 69 s ago, keys[0] and keys[3] 59 s ago
    assert picker.pick(workers(0, 0), keys[0]).reason is PickReason.AFFINITY
    assert picker.holders(keys[2]) == [] and len(picker) == 2
    clock.t += 60
    assert picker.pick(workers(0, 0), keys[3]).reason is PickReason.NEW_PREFIX  # idle 119 s: forgotten
    assert picker.prefix_groups() in ({"w0": 1}, {"w1": 1}) and len(picker) == 1


def test_no_key_picks_the_least_loaded():
    pick = WorkerPicker().pick(workers(500, 20, 300), None)
    assert (pick.worker_id, pick.reason) == ("w1", PickReason.LEAST_LOADED)
    with pytest.raises(ModelUnavailableError):
        WorkerPicker().pick([], None)
    with pytest.raises(ValueError):
        WorkerPicker(load_bound=0.9)
    with pytest.raises(ValueError):
        WorkerPicker(max_prefixes=0)
