"""Which worker of a version serves a request: prefix affinity under a load bound.

The key: the chained KV block hash (engine/hashing.py, the prefix cache's own function and
tenant salt) of the prompt's first `affinity_key_blocks` full blocks. Requests that share those
leading blocks — the same system prompt, the same few-shot header, a conversation's earlier
turns — get the same key (one *prefix group*), and a tenant's key never equals another
tenant's, exactly as their cache entries never match.

The picker remembers where it sent each prefix group: a bounded LRU map key → the workers
that hold it (the ones it was sent to), with the number of groups each worker holds. A pick:

1. A known key goes to the least-loaded of its holders whose outstanding work is within the
   bound `load(w) ≤ load_bound × min_load + slack_tokens` (min_load: the least-loaded
   candidate's) — the worker whose KV pool has the prefix, while it is at most 1.25×
   (default) busier than the idlest. `AFFINITY`.
2. A known key whose holders are all over the bound (or cannot take requests now) *spills*:
   it is placed as in 3 on one more worker, which joins its holders, so a hot prefix spreads
   over the fewest workers it needs and each keeps its cache warm. `SPILL`.
3. A new key is placed on the worker within the bound that holds the fewest prefix groups
   (then the least loaded; the rendezvous hash of (key, worker id) breaks ties, so the choice
   is deterministic). `NEW_PREFIX`. This is what balances the *cache*: the load bound alone
   sees only the work in flight, and a sequence of short requests leaves every worker idle,
   so before this table a hash chose alone and eight tenants could split 6/2 over two
   workers, the busier pool evicting (bench/serving/prefix_affinity.py). Bounding each worker's
   share of the keys, not only of the load, is the other half of consistent hashing with
   bounded loads (Mirrokni et al.); SGLang's cache-aware router places unmatched prompts on
   the worker with the smallest prefix tree for the same reason.
4. No key (a prompt shorter than one block): the least-loaded worker. `LEAST_LOADED`.

The least-loaded worker always satisfies the bound, so a pick always exists. slack_tokens
keeps affinity alive on an idle fleet (1.25 × 0 is 0).

What is forgotten: a group no request has used for `idle_ttl_s` (its KV has most likely been
evicted by then, and a stale group must not skew the balance), the least recently used groups
beyond `max_prefixes`, and every group of a worker that is removed, goes down or restarts
(`forget`: its cache is gone; the router calls it from the pool's notices). Memory is bounded
by `max_prefixes` (a key is 32 bytes; a group costs a few hundred bytes).

The state is per gateway replica: two replicas that have seen different requests may place a
new prefix differently (each then keeps it sticky, so a group costs at most one cache copy per
replica that saw it). The rendezvous tie-break makes replicas in the same state agree — e.g.
on a fresh fleet. Sharing the table (GIE/llm-d's prefix index problem) is not done.

Load is "tokens queued + running" per worker, supplied by the caller (dispatch/worker_pool.py combines
the worker's reported stats with this gateway's own in-flight dispatches).
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sluice.engine.hashing import extend_hashes
from sluice.routing.errors import ModelUnavailableError

# Defaults for the table's bounds: far more groups than a fleet's KV pools hold, and an idle
# time after which a prefix is very likely evicted from a busy worker's pool.
DEFAULT_MAX_PREFIXES = 20_000
DEFAULT_IDLE_TTL_S = 600.0


class PickReason(str, enum.Enum):
    AFFINITY = "affinity"  # a worker that holds the prefix (it was sent there before)
    SPILL = "spill"  # the prefix's workers were over the bound: one more worker takes it
    NEW_PREFIX = "new_prefix"  # an unseen prefix: the worker within the bound with the fewest prefixes
    LEAST_LOADED = "least_loaded"  # no prefix key (the prompt is shorter than one block)
    ROUND_ROBIN = "round_robin"  # `worker_choice = "round_robin"`: the next worker in turn


@dataclass(slots=True, frozen=True)
class Candidate:
    worker_id: str
    load_tokens: int  # outstanding work: tokens queued + running


@dataclass(slots=True, frozen=True)
class Pick:
    worker_id: str
    reason: PickReason
    rank: int  # AFFINITY: the holder's place among the prefix's workers; SPILL: how many it had


@dataclass(slots=True)
class _Group:
    holders: list[str] = field(default_factory=list)  # in the order the prefix was placed on them
    last_used: float = 0.0


def affinity_key(prompt_token_ids: Sequence[int], block_size: int, key_blocks: int, salt: str) -> bytes | None:
    """The chain hash of the prompt's first `key_blocks` full blocks (fewer if the prompt is
    shorter), or None when it has no full block."""
    hashes: list[bytes] = []
    extend_hashes(hashes, list(prompt_token_ids[: key_blocks * block_size]), block_size, salt)
    return hashes[-1] if hashes else None


def _rank(key: bytes, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + b"\x00" + worker_id.encode(), digest_size=8).digest(), "big")


class WorkerPicker:
    def __init__(
        self,
        load_bound: float = 1.25,
        slack_tokens: int = 512,
        *,
        max_prefixes: int = DEFAULT_MAX_PREFIXES,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        if load_bound < 1.0 or slack_tokens < 0:
            raise ValueError("load_bound must be >= 1 and slack_tokens >= 0")
        if max_prefixes < 1 or idle_ttl_s <= 0:
            raise ValueError("max_prefixes must be >= 1 and idle_ttl_s > 0")
        self.load_bound = load_bound
        self.slack_tokens = slack_tokens
        self.max_prefixes = max_prefixes
        self.idle_ttl_s = idle_ttl_s
        self._clock = clock
        self._groups: OrderedDict[bytes, _Group] = OrderedDict()  # least recently used first
        self._held: dict[str, int] = {}  # worker id -> prefix groups it holds

    # -- views --------------------------------------------------------------------------------
    def bound(self, candidates: Sequence[Candidate]) -> float:
        return self.load_bound * min(c.load_tokens for c in candidates) + self.slack_tokens

    def order(self, candidates: Sequence[Candidate], key: bytes) -> list[Candidate]:
        """The rendezvous order of the candidates for a key: the tie-break among equals."""
        return sorted(candidates, key=lambda c: (_rank(key, c.worker_id), c.worker_id), reverse=True)

    def holders(self, key: bytes) -> list[str]:
        """The workers the prefix group was sent to (empty: unknown or forgotten)."""
        group = self._groups.get(key)
        return list(group.holders) if group is not None else []

    def prefix_groups(self) -> dict[str, int]:
        """Prefix groups per worker (the balance new prefixes are placed by)."""
        self._expire(self._clock())
        return {w: n for w, n in self._held.items() if n > 0}

    def __len__(self) -> int:
        return len(self._groups)

    # -- the choice ---------------------------------------------------------------------------
    def pick(self, candidates: Sequence[Candidate], key: bytes | None) -> Pick:
        if not candidates:
            raise ModelUnavailableError("no worker can take the request now")
        if key is None:
            best = min(candidates, key=lambda c: (c.load_tokens, c.worker_id))
            return Pick(best.worker_id, PickReason.LEAST_LOADED, 0)
        now = self._clock()
        self._expire(now)
        limit = self.bound(candidates)
        within = [c for c in candidates if c.load_tokens <= limit]  # never empty: the least loaded is
        group = self._groups.get(key)
        if group is not None:
            at = {w: i for i, w in enumerate(group.holders)}
            mine = [c for c in within if c.worker_id in at]
            self._touch(key, group, now)
            if mine:
                best = min(mine, key=lambda c: (c.load_tokens, at[c.worker_id]))
                return Pick(best.worker_id, PickReason.AFFINITY, at[best.worker_id])
            spilled = len(group.holders)
            chosen = self._place(within, key)
            self._hold(group, chosen.worker_id)
            return Pick(chosen.worker_id, PickReason.SPILL, spilled)
        chosen = self._place(within, key)
        group = _Group()
        self._groups[key] = group
        self._touch(key, group, now)
        self._hold(group, chosen.worker_id)
        self._trim()
        return Pick(chosen.worker_id, PickReason.NEW_PREFIX, 0)

    def forget(self, worker_id: str) -> int:
        """Drop the worker from every group (it left, went down or restarted: its cache is
        gone); returns how many groups it held. Groups left with no worker are dropped."""
        if not self._held.pop(worker_id, 0):
            return 0
        dropped = 0
        for key in list(self._groups):
            group = self._groups[key]
            if worker_id in group.holders:
                group.holders.remove(worker_id)
                dropped += 1
                if not group.holders:
                    del self._groups[key]
        return dropped

    # -- the table ----------------------------------------------------------------------------
    def _place(self, within: Sequence[Candidate], key: bytes) -> Candidate:
        """The worker a prefix is placed on: fewest groups, then least loaded, then rendezvous."""
        return min(
            within, key=lambda c: (self._held.get(c.worker_id, 0), c.load_tokens, -_rank(key, c.worker_id), c.worker_id)
        )

    def _hold(self, group: _Group, worker_id: str) -> None:
        group.holders.append(worker_id)
        self._held[worker_id] = self._held.get(worker_id, 0) + 1

    def _touch(self, key: bytes, group: _Group, now: float) -> None:
        group.last_used = now
        self._groups.move_to_end(key)

    def _drop(self, key: bytes) -> None:
        group = self._groups.pop(key)
        for w in group.holders:
            self._held[w] -= 1
            if not self._held[w]:
                del self._held[w]

    def _expire(self, now: float) -> None:
        # least recently used first, so the idle ones are at the front
        while self._groups:
            key, group = next(iter(self._groups.items()))
            if now - group.last_used < self.idle_ttl_s:
                break
            self._drop(key)

    def _trim(self) -> None:
        while len(self._groups) > self.max_prefixes:
            self._drop(next(iter(self._groups)))
