"""Idempotency records in Redis, shared by every gateway replica (the memory store's behaviour).

One hash per record (`<prefix>:idem:<scoped key>`: fingerprint, token, phase, stream id, reply)
with a TTL: the lease while running, the idempotency TTL once done. Each operation that decides
something is one Lua script, so it is atomic on the Redis server: a claim is "create unless it
exists, else hand back the holder" (two replicas racing for one key: exactly one wins), and
complete / renew / release act only for the token that holds the claim, so an attempt whose
lease ran out (its replica stalled) can never overwrite or delete a newer attempt's record.
TTLs are in the Redis server's clock, so replica clocks do not matter.

Waiting for a running claim polls (`changed`): a retry that waits is rare, and a pub/sub
subscription per waiter would cost a connection each.
"""

from __future__ import annotations

import asyncio

from sluice.redis_client import redis_client
from sluice.serving.idempotency.store import Phase, Record, StoredReply

POLL_S = 0.05

# KEYS: record. ARGV: fingerprint, token, stream id ('' = none), lease ms. Nil when claimed.
CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HGETALL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'token', ARGV[2], 'phase', 'running', 'stream', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return false
"""

# KEYS: record. ARGV: token, reply JSON, ttl ms.
COMPLETE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'phase', 'done', 'reply', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: record. ARGV: token, lease ms.
RENEW = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] and redis.call('HGET', KEYS[1], 'phase') == 'running' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""

# KEYS: record. ARGV: token. A completed record is never released (it answers retries until its TTL).
RELEASE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] and redis.call('HGET', KEYS[1], 'phase') == 'running' then
  redis.call('DEL', KEYS[1])
end
return 1
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisIdempotencyStore:
    def __init__(self, url: str, prefix: str = "sluice", max_connections: int = 32):
        # short timeouts, as for the limiter: a store that hangs would stall every keyed request
        self.redis = redis_client(url, max_connections=max_connections, socket_timeout_s=2.0)
        self.prefix = prefix
        self._claim = self.redis.register_script(CLAIM)
        self._complete = self.redis.register_script(COMPLETE)
        self._renew = self.redis.register_script(RENEW)
        self._release = self.redis.register_script(RELEASE)

    def _key(self, key: str) -> str:
        return f"{self.prefix}:idem:{key}"

    async def claim(self, key: str, record: Record, lease_s: float) -> Record | None:
        held = await self._claim(
            keys=[self._key(key)], args=[record.fingerprint, record.token, record.stream_id or "", _ms(lease_s)]
        )
        if not held:
            return None
        fields = dict(zip(held[::2], held[1::2]))
        reply = StoredReply.from_json(fields["reply"]) if fields.get("reply") else None
        return Record(
            fields.get("fp", ""),
            fields.get("token", ""),
            Phase(fields.get("phase", "running")),
            fields.get("stream") or None,
            reply,
        )

    async def renew(self, key: str, token: str, lease_s: float) -> None:
        await self._renew(keys=[self._key(key)], args=[token, _ms(lease_s)])

    async def complete(self, key: str, token: str, reply: StoredReply, ttl_s: float) -> bool:
        return int(await self._complete(keys=[self._key(key)], args=[token, reply.to_json(), _ms(ttl_s)])) == 1

    async def release(self, key: str, token: str) -> None:
        await self._release(keys=[self._key(key)], args=[token])

    async def changed(self, key: str, timeout_s: float) -> None:
        await asyncio.sleep(min(timeout_s, POLL_S))

    async def close(self) -> None:
        await self.redis.aclose()
