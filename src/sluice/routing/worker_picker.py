"""Which worker of a version serves a request: prefix affinity under a load bound.

The key: the chained KV block hash (engine/hashing.py, the prefix cache's own function and
tenant salt) of the prompt's first `affinity_key_blocks` full blocks. Requests that share those
leading blocks — the same system prompt, the same few-shot header, a conversation's earlier
turns — get the same key, and a tenant's key never equals another tenant's, exactly as their
cache entries never match.

The choice: rank the candidate workers by rendezvous hash of (key, worker id) — a stable
preference order per prefix that moves only the keys of a worker that joins or leaves — and
take the first worker whose outstanding work is within the bound

    load(w) ≤ load_bound × min_load + slack_tokens

where min_load is the least-loaded candidate's. This is consistent hashing with bounded loads
(Mirrokni et al.) with the bound tied to the least-loaded worker rather than the mean: a prefix
keeps its worker (and its cached KV) while that worker is at most 1.25× (default) busier than
the idlest one, then spills to its *next* worker in order, so a hot prefix spreads over the
fewest workers it needs and each of them keeps its cache warm. The least-loaded worker always
satisfies the bound, so a pick always exists. slack_tokens keeps affinity alive on an idle
fleet (1.25 × 0 is 0). A prompt shorter than one block has no key: least loaded wins.

Stateless on purpose: no index of which worker cached what, so every gateway replica makes
the same choice for the same prefix without sharing anything (the active-active problem
GIE/llm-d's in-memory prefix index has), and nothing grows with traffic.

Load is "tokens queued + running" per worker, supplied by the caller (worker_pool.py combines
the worker's reported stats with this gateway's own in-flight dispatches).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.engine.hashing import extend_hashes
from sluice.routing.errors import ModelUnavailableError


class PickReason(str, enum.Enum):
    AFFINITY = "affinity"  # the prefix's first-choice worker
    SPILL = "spill"  # a later worker in the prefix's order: the earlier ones were over the bound
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
    rank: int  # 0 = the prefix's first choice


def prefix_salt(tenant: str, share_across_tenants: bool = False) -> str:
    """The namespace the engine's prefix cache uses (kv_manager: tenant unless shared)."""
    return "" if share_across_tenants else tenant


def affinity_key(prompt_token_ids: Sequence[int], block_size: int, key_blocks: int, salt: str) -> bytes | None:
    """The chain hash of the prompt's first `key_blocks` full blocks (fewer if the prompt is
    shorter), or None when it has no full block."""
    hashes: list[bytes] = []
    extend_hashes(hashes, list(prompt_token_ids[: key_blocks * block_size]), block_size, salt)
    return hashes[-1] if hashes else None


def _rank(key: bytes, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + b"\x00" + worker_id.encode(), digest_size=8).digest(), "big")


class WorkerPicker:
    def __init__(self, load_bound: float = 1.25, slack_tokens: int = 512):
        if load_bound < 1.0 or slack_tokens < 0:
            raise ValueError("load_bound must be >= 1 and slack_tokens >= 0")
        self.load_bound = load_bound
        self.slack_tokens = slack_tokens

    def bound(self, candidates: Sequence[Candidate]) -> float:
        return self.load_bound * min(c.load_tokens for c in candidates) + self.slack_tokens

    def order(self, candidates: Sequence[Candidate], key: bytes) -> list[Candidate]:
        """The prefix's preference order over the candidates."""
        return sorted(candidates, key=lambda c: (_rank(key, c.worker_id), c.worker_id), reverse=True)

    def pick(self, candidates: Sequence[Candidate], key: bytes | None) -> Pick:
        if not candidates:
            raise ModelUnavailableError("no worker can take the request now")
        if key is None:
            best = min(candidates, key=lambda c: (c.load_tokens, c.worker_id))
            return Pick(best.worker_id, PickReason.LEAST_LOADED, 0)
        limit = self.bound(candidates)
        for rank, c in enumerate(self.order(candidates, key)):
            if c.load_tokens <= limit:
                return Pick(c.worker_id, PickReason.AFFINITY if rank == 0 else PickReason.SPILL, rank)
        raise AssertionError("unreachable: the least-loaded candidate is always within the bound")
