"""Idempotent retries: a generation request that carries an `Idempotency-Key` runs at most once.

The meaning follows the IETF httpapi Idempotency-Key draft; the wire formats only read the header
and render (api/idempotent.py). Per (tenant, key) — another tenant's identical key is unrelated:

- the first attempt claims the key (atomically, in the store) and runs. A completed reply is
  kept for `idempotency_ttl_s` (status, the headers the pipeline set, the body as sent); a
  stream generates detached from its connection, recorded in the replay log as it goes, and its
  events are kept when it ends properly;
- a retry with the same body gets that reply again — not generated, not charged: it never
  reaches the gateway. A retry while the first attempt still runs waits for it (a reply) or
  follows its replay log (a stream, from `Last-Event-ID` where the wire has one);
- the same key with a different body (or on another route) is UNPROCESSABLE (422, the draft's
  answer); a first attempt still running after the caller's wait is CONFLICT (409, retry);
- a first attempt that did not complete — refused, failed, aborted, its gateway gone (its lease
  is not renewed) — releases the key, so a retry runs again.

When the store fails (Redis down), `on_store_error` decides, as for the rate limits: "open" runs
the request unprotected, "closed" refuses it (OVERLOADED); one warning per 30 s, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from anyio import CancelScope

from sluice.config import Settings, StoreKind
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.idempotency.store import MB, IdempotencyStore, MemoryIdempotencyStore, Phase, Record, StoredReply
from sluice.streaming.recorder import Recording
from sluice.streaming.replay_log import ReplayEvent, ReplayLog

log = logging.getLogger("sluice.idempotency")
LEASE_S = 30.0  # a running claim outlives its gateway by at most this; renewed every LEASE_S / 3
POLL_S = 0.25  # a waiting retry re-reads the record at least this often
MAX_REPLY_BYTES = 4 * MB  # a larger reply is not kept: a retry of it runs again
WARN_EVERY_S = 30.0


class Action(str, enum.Enum):
    RUN = "run"  # generate (with a claim when keyed)
    REPLAY = "replay"  # send the kept reply
    FOLLOW = "follow"  # attach to the first attempt's stream in the replay log


def fingerprint(route: str, payload: dict[str, Any]) -> str:
    """What makes two requests "the same": the route and the canonical validated body."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{route}\n{canonical}".encode()).hexdigest()


def scoped_key(tenant: str, key: str) -> str:
    # hashed: keys and tenant names never appear in the store, and any key fits any store
    return hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()


class Claim:
    """The first attempt's hold on a key: renewed while it runs, settled exactly once."""

    def __init__(self, owner: Idempotency, key: str, token: str):
        self._owner, self._key, self.token = owner, key, token
        self.settled = False
        self.handed_over = False  # a detached stream settles it when it ends
        self._renewing = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._owner.lease_s / 3)
            await self._owner.guarded(self._owner.store.renew(self._key, self.token, self._owner.lease_s))

    async def settle(self, reply: StoredReply | None) -> None:
        """Keep `reply` (None, or one over MAX_REPLY_BYTES: release the key instead)."""
        if self.settled:
            return
        self.settled = True
        self._renewing.cancel()
        with CancelScope(shield=True):  # a disconnect's cancellation must not lose the settlement
            store = self._owner.store
            if reply is not None and reply.size() <= MAX_REPLY_BYTES:
                await self._owner.guarded(store.complete(self._key, self.token, reply, self._owner.ttl_s))
            else:
                await self._owner.guarded(store.release(self._key, self.token))


@dataclass(slots=True)
class Attempt:
    """What one request does about its key. Unkeyed requests get `Attempt(Action.RUN)`: every
    method is then a no-op, so a route reads the same either way."""

    action: Action
    claim: Claim | None = None
    reply: StoredReply | None = None
    stream_id: str | None = None

    @property
    def keyed(self) -> bool:
        return self.claim is not None

    async def complete(self, reply: StoredReply) -> None:
        if self.claim is not None:
            await self.claim.settle(reply)

    async def release(self) -> None:
        if self.claim is not None:
            await self.claim.settle(None)

    @contextlib.asynccontextmanager
    async def settles(self) -> AsyncGenerator[None, None]:
        """Whatever happens inside — a refusal, a failure, a client gone, a cancellation — the key
        is released unless the reply was kept or a detached stream took the claim over."""
        try:
            yield
        finally:
            if self.claim is not None and not self.claim.settled and not self.claim.handed_over:
                await self.claim.settle(None)

    def detach(
        self,
        recording: Recording,
        keep: Callable[[asyncio.Task], None],
        headers: Callable[[], dict[str, str]],
        ended_well: Callable[[ReplayEvent], bool],
    ) -> asyncio.Task:
        """Run a keyed stream to its end as a server task (its response and retries follow the
        replay log); keep its events when its last one `ended_well`, else release the key."""
        claim = self.claim
        assert claim is not None
        claim.handed_over = True

        async def drain() -> None:
            events: list[ReplayEvent] = []
            size, last = 0, None
            try:
                async for event in recording.events():
                    if event.seq:
                        last = event
                        size += len(event.data) + 16
                        if size <= MAX_REPLY_BYTES:
                            events.append(event)
            finally:
                await recording.close()
                good = last is not None and ended_well(last) and size <= MAX_REPLY_BYTES
                await claim.settle(StoredReply(200, headers(), events=events) if good else None)

        task = asyncio.get_running_loop().create_task(drain(), name="sluice-idempotent-stream")
        keep(task)
        return task


class Idempotency:
    def __init__(
        self,
        store: IdempotencyStore,
        replay: ReplayLog,
        ttl_s: float,
        on_store_error: str = "open",
        lease_s: float = LEASE_S,
    ):
        self.store, self.replay, self.ttl_s, self.lease_s = store, replay, ttl_s, lease_s
        self.on_store_error = on_store_error
        self._last_warning = 0.0

    async def begin(self, tenant: str, key: str, fp: str, stream_id: str | None, wait_s: float) -> Attempt:
        """Claim `key` for a request with fingerprint `fp` (a stream names its replay log id), or
        find what its first attempt left. Waits at most `wait_s` for a first attempt still running."""
        scoped = scoped_key(tenant, key)
        record = Record(fp, uuid.uuid4().hex, Phase.RUNNING, stream_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                held = await self.store.claim(scoped, record, self.lease_s)
            except Exception as exc:  # the store is down: the configured policy, never a 500
                self._warn(exc)
                if self.on_store_error == "open":
                    return Attempt(Action.RUN)
                raise ServingError(
                    ErrorKind.OVERLOADED, "idempotency keys are unavailable; try again shortly", retry_after_s=5.0
                ) from None
            if held is None:
                return Attempt(Action.RUN, Claim(self, scoped, record.token))
            if held.fingerprint != fp:
                raise ServingError(
                    ErrorKind.UNPROCESSABLE,
                    "Idempotency-Key: this key was already used with a "
                    "different request; use a new key for a new request",
                    code="idempotency_key_reused",
                )
            if held.phase is Phase.DONE and held.reply is not None:
                return Attempt(Action.REPLAY, reply=held.reply, stream_id=held.stream_id)
            # a stream is followed once its log is open (its first attempt opens it on admission)
            if held.stream_id is not None and await self.replay.owner(held.stream_id) == tenant:
                return Attempt(Action.FOLLOW, stream_id=held.stream_id)
            left = deadline - loop.time()
            if left <= 0:
                raise ServingError(
                    ErrorKind.CONFLICT,
                    "Idempotency-Key: a request with this key is still in progress; retry later",
                    retry_after_s=1.0,
                    code="idempotency_key_in_progress",
                )
            await self.store.changed(scoped, min(left, POLL_S))

    async def guarded(self, op: Any) -> None:
        try:
            await op
        except Exception as exc:  # a lost completion: a retry runs again; a lost release frees at lease end
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_warning > WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "idempotency store unavailable (%s: %s); failing %s", type(exc).__name__, exc, self.on_store_error
            )

    async def close(self) -> None:
        await self.store.close()


def build_idempotency(settings: Settings, replay: ReplayLog) -> Idempotency:
    if settings.idempotency_store is StoreKind.REDIS:
        from sluice.serving.idempotency.redis_store import RedisIdempotencyStore

        store: IdempotencyStore = RedisIdempotencyStore(settings.redis_url)
    else:
        store = MemoryIdempotencyStore()
    return Idempotency(store, replay, settings.idempotency_ttl_s, settings.on_store_error)
