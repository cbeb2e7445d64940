"""One round of a query: one typed request to each of many shards at once.

Each shard answers through a replica (shard_call.py: replica choice, failover, hedging) or, for
a cold shard, through the router's cold tier (tiers/cold_tier.py), and every answer is decoded
through the contract (search/contract.py); an answer that does not decode counts as that shard
failing. A shard that fails is recorded in the query's `failed` — the answer says partial — and
left out of the rounds after; a replica's refusal (4xx) is the query's fault, raised as a
QuerySyntaxError.

The query's deadline is shared by its rounds; a round that another may follow gets half of the
time left (QueryRun.followed_deadline), so that one stalled shard costs that round its answer
but leaves the last round time to search the shards that did answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence

from sluice.search.contract import ShardSearchAnswer, ShardSearchRequest, StatsAnswer, StatsRequest
from sluice.search.errors import QuerySyntaxError, ShardCallError, ShardFailure
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import Hit
from sluice.search.router.cluster.replica_state import ReplicaState
from sluice.search.router.cluster.topology import ShardRuntime
from sluice.search.router.query.shard_call import ShardCaller
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.tiers.cold_tier import ColdTier
from sluice.search.tiers.local_reads import LocalReads

FOLLOWED_SHARE = 0.5  # of the time left, what a round that another round follows may spend
Request = StatsRequest | ShardSearchRequest
Answer = StatsAnswer | ShardSearchAnswer
_ANSWER_OF: dict[type, type[StatsAnswer] | type[ShardSearchAnswer]] = {
    StatsRequest: StatsAnswer,
    ShardSearchRequest: ShardSearchAnswer,
}


@dataclasses.dataclass(slots=True)
class QueryRun:
    """One query's state across its rounds."""

    revision: tuple[int, ...]  # every shard's newest acknowledged entry when the query began
    deadline: float  # time.perf_counter() by which the last round must be done
    chosen: dict[int, ReplicaState | None]  # shard position → the replica that answered it last
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # shard name → a ShardFailure

    def followed_deadline(self) -> float:
        """The deadline of a round that another follows: half of the time left."""
        now = time.perf_counter()
        return now + max(0.0, self.deadline - now) * FOLLOWED_SHARE

    def live(self, shards: Sequence[ShardRuntime]) -> list[ShardRuntime]:
        return [s for s in shards if s.name not in self.failed]


class FanOut:
    def __init__(
        self, caller: ShardCaller, metrics: SearchMetrics, cold: ColdTier | None = None, local: LocalReads | None = None
    ):
        self.caller, self.metrics, self.cold, self.local = caller, metrics, cold, local

    async def round(
        self,
        shards: Sequence[ShardRuntime],
        request: Request | Callable[[ShardRuntime], Request],
        deadline: float,
        run: QueryRun,
        prefer_chosen: bool = False,
    ) -> list[tuple[ShardRuntime, Answer]]:
        """Each shard's answer to `request` (or to request(shard)), in order; the shards that
        failed are in run.failed instead."""

        def req(s: ShardRuntime) -> Request:
            return request(s) if callable(request) else request

        # the shards read locally are answered here, in this task, one after another as their
        # tasks ran before: a task per local shard and their gather cost the router more CPU
        # than merging the answers. The others are then asked at once.
        answers: list[tuple[ReplicaState | None, Answer] | BaseException | None] = []
        remote: list[tuple[int, ShardRuntime, Request]] = []
        for i, s in enumerate(shards):
            r = req(s)
            answers.append(self._local(s, r))
            if answers[-1] is None:
                remote.append((i, s, r))
        if remote:
            asked = await asyncio.gather(
                *(self.ask(s, r, deadline, run.chosen[s.position] if prefer_chosen else None) for _, s, r in remote),
                return_exceptions=True,
            )
            for (i, _, _), got in zip(remote, asked):
                answers[i] = got
        out: list[tuple[ShardRuntime, Answer]] = []
        for s, a in zip(shards, answers):
            if isinstance(a, ShardCallError):
                run.failed[s.name] = a.failure.value
                continue
            if isinstance(a, BaseException):
                raise a
            assert a is not None
            replica, answer = a
            if replica is not None:
                run.chosen[s.position] = replica  # the next round prefers it: one revision when idle
            if isinstance(answer, ShardSearchAnswer) and answer.index_s is not None:
                s.index_latency.add(answer.index_s)
                s.index_busy_s += answer.index_s  # the hot-shard signal (replication/hot_shards.py)
            out.append((s, answer))
        return out

    def all_local(self, shards: Sequence[ShardRuntime]) -> bool:
        """Whether every one of `shards` is read in this process (a local reader, not cold)."""
        local = self.local
        if local is None:
            return False
        cold = self.cold is not None
        return all(local.has(s.position) and not (cold and s.cold_url is not None) for s in shards)

    def local_stats(
        self, shards: Sequence[ShardRuntime], terms: Callable[[ShardRuntime], list[str]]
    ) -> list[tuple[ShardRuntime, CollectionStats, int]] | None:
        """A statistics round's answers — each shard's statistics of terms(shard) and the entry
        they are at — when every one of `shards` is read in this process; None when not (or a
        reader cannot answer at its shard's entry), and the round must ask.

        Why not the round itself: a local shard's statistics are a few calls into Xapian, and a
        round's request and answer objects and per-shard bookkeeping cost the router more than
        the reads (docs/SEARCH.md "A local read's CPU")."""
        if not self.all_local(shards):
            return None
        assert self.local is not None
        got = self.local.stats((s.position, s.head_seq, terms(s)) for s in shards)
        return None if got is None else [(s, stats, seq) for s, (stats, seq) in zip(shards, got)]

    def local_top(self, shards: Sequence[ShardRuntime], request: ShardSearchRequest) -> list[Hit] | None:
        """A lexical search round's merged top_k when every one of `shards` is read in this
        process: query then fetch (LocalReads.top: only the returned hits' documents are read);
        None when not (one shard: every document it ranks is returned, nothing to save; a dense
        or one-round request; a shard not local; a reader that cannot answer at its shard's
        entry), and the round must ask. Each shard's time is kept as a round's answer's would be
        (its latency, its index time: the hot-shard signal)."""
        if len(shards) < 2 or request.vector is not None or request.unknown is not None or not self.all_local(shards):
            return None
        assert self.local is not None
        return self._timed(shards, request, self.local.top([(s.position, s.head_seq) for s in shards], request))

    def local_union(self, shards: Sequence[ShardRuntime], request: ShardSearchRequest) -> list[Hit] | None:
        """A lexical search's merged top_k when every one of `shards` is read in this process, as
        one search of their union (LocalReads.union_top; one shard: its own index): `request`
        carries no statistics, the union's own are the global ones. None as local_top."""
        if (
            not shards
            or request.vector is not None
            or request.stats is not None
            or request.pruned
            or not self.all_local(shards)
        ):
            return None
        assert self.local is not None
        return self._timed(shards, request, self.local.union_top([(s.position, s.head_seq) for s in shards], request))

    def _timed(
        self, shards: Sequence[ShardRuntime], request: ShardSearchRequest, got: tuple[list[Hit], list[float]] | None
    ) -> list[Hit] | None:
        """A local search's hits; each shard's seconds kept as a round's answer's would be (its
        latency, its index time: the hot-shard signal)."""
        if got is None:
            return None
        hits, seconds = got
        for s, elapsed in zip(shards, seconds):
            s.latency.add(elapsed)
            s.index_latency.add(elapsed)
            s.index_busy_s += elapsed  # the hot-shard signal (replication/hot_shards.py)
            self.metrics.child(self.metrics.shard_latency, s.name, request.PHASE).observe(elapsed)
        return hits

    def _local(self, shard: ShardRuntime, req: Request) -> tuple[None, Answer] | None:
        """The shard's answer from its local reader (tiers/local_reads.py), or None when it has
        none (a cold shard, no local replica) or it cannot answer at the shard's newest entry."""
        local = self.local
        if local is None or not local.has(shard.position) or (shard.cold_url is not None and self.cold is not None):
            return None
        t0 = time.perf_counter()
        answer = local.call(shard.position, req, shard.head_seq)
        if answer is None:
            return None
        elapsed = time.perf_counter() - t0
        if isinstance(answer, ShardSearchAnswer):
            answer.index_s = elapsed
        shard.latency.add(elapsed)
        self.metrics.child(self.metrics.shard_latency, shard.name, req.PHASE).observe(elapsed)
        return None, answer

    async def ask(
        self, shard: ShardRuntime, req: Request, deadline: float, prefer: ReplicaState | None
    ) -> tuple[ReplicaState | None, Answer]:
        t0 = time.perf_counter()
        if shard.cold_url is not None and self.cold is not None:
            answer = await self._cold(shard, req, deadline)
            self.metrics.child(self.metrics.shard_latency, shard.name, req.PHASE).observe(time.perf_counter() - t0)
            return None, answer
        try:
            replica, data = await self.caller.call(shard, req.PATH, req.to_json(), deadline, req.PHASE, prefer)
        except ShardCallError as exc:
            self.metrics.errors.labels(exc.failure.value).inc()
            if exc.failure is ShardFailure.BAD_QUERY:
                raise QuerySyntaxError(0, exc.message) from None
            raise
        try:
            answer = _ANSWER_OF[type(req)].decode(data)
        except (KeyError, TypeError, ValueError):
            self.metrics.errors.labels(ShardFailure.UNAVAILABLE.value).inc()
            raise ShardCallError(
                shard.name, ShardFailure.UNAVAILABLE, f"replica {replica.name}: a malformed answer"
            ) from None
        self.metrics.child(self.metrics.shard_latency, shard.name, req.PHASE).observe(time.perf_counter() - t0)
        return replica, answer

    async def _cold(self, shard: ShardRuntime, req: Request, deadline: float) -> Answer:
        """A cold shard answers from the router's cold tier; its first query fetches it (which may
        miss the deadline: the fetch goes on, the answer is partial, the next query is warm)."""
        assert self.cold is not None and shard.cold_url is not None
        task = asyncio.ensure_future(self.cold.call(shard.cold_url, req))
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            self.metrics.errors.labels(ShardFailure.TIMEOUT.value).inc()
            raise ShardCallError(
                shard.name, ShardFailure.TIMEOUT, "cold shard not fetched within the deadline"
            ) from None
        except Exception as exc:  # the object store is down or the archive is missing
            self.metrics.errors.labels(ShardFailure.UNAVAILABLE.value).inc()
            raise ShardCallError(
                shard.name, ShardFailure.UNAVAILABLE, f"cold shard: {type(exc).__name__}: {exc}"[:300]
            ) from None
