"""Token buckets and concurrency slots in Redis, shared by every gateway replica.

Each operation is one Lua script, so it is atomic on the Redis server: read every bucket of the
key, refill by the time elapsed (Redis server TIME, so replica clocks do not matter), check all
dimensions, deduct all or none, write back with a TTL that lasts until the bucket would be full
again (a missing bucket reads as full, so expiry forgets nothing). The arithmetic is
token_bucket.py's, line for line. Concurrency slots are members of a sorted set scored by lease
expiry: a gateway that crashes mid-request leaks a slot only until its lease runs out.

One round trip per acquire and per settle; all of a principal's keys share one `{hash tag}`,
so the scripts also run on Redis Cluster.
"""

from __future__ import annotations

import uuid

from sluice.gateway.limits import BucketState, Decision, LimitReason, Limits
from sluice.gateway.token_bucket import WINDOW_S, reset_s
from sluice.redis_client import redis_client

# Every script starts here: Redis' own clock (one clock for every gateway), and the window.
NOW_AND_WINDOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[1])"""

# KEYS: bucket keys..., concurrency key.  ARGV: window, lease_ttl, max_concurrent (-1 = none),
# lease id, then (limit, cost) per bucket. Returns {allowed, retry_after, reason, left...}
# (numbers as strings: Lua numbers would be truncated to integers on the way out).
ACQUIRE = (
    NOW_AND_WINDOW
    + """
local lease_ttl = tonumber(ARGV[2])
local max_conc = tonumber(ARGV[3])
local nb = #KEYS - 1
local levels = {}
local retry = 0
local reason = ''
for i = 1, nb do
  local limit = tonumber(ARGV[3 + 2 * i])
  local cost = tonumber(ARGV[4 + 2 * i])
  local st = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local level = limit
  if st[1] then
    level = math.min(limit, tonumber(st[1]) + math.max(0, now - tonumber(st[2])) * limit / window)
  end
  levels[i] = level
  local short = math.min(cost, limit) - level  -- an oversize cost needs a full bucket, no more
  if short > 0 then
    local wait = short * window / limit
    if wait > retry then retry = wait; reason = tostring(i) end
  end
end
local ckey = KEYS[#KEYS]
if reason == '' and max_conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', ckey, '-inf', now)
  if redis.call('ZCARD', ckey) >= max_conc then
    retry = 1; reason = 'concurrency'
  end
end
local allowed = 0
if reason == '' then allowed = 1 end
local out = {allowed, tostring(retry), reason}
for i = 1, nb do
  local limit = tonumber(ARGV[3 + 2 * i])
  local left = levels[i]
  if allowed == 1 then left = left - tonumber(ARGV[4 + 2 * i]) end
  redis.call('HSET', KEYS[i], 'tokens', tostring(left), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[i], math.floor((limit - left) * window / limit) + 2)
  table.insert(out, tostring(left))
end
if allowed == 1 and max_conc >= 0 then
  redis.call('ZADD', ckey, now + lease_ttl, ARGV[4])
  redis.call('EXPIRE', ckey, math.ceil(lease_ttl) + 2)
end
return out
"""
)

# KEYS: output bucket, concurrency key. ARGV: window, limit (-1 = none), refund, lease ('' = none)
SETTLE = (
    NOW_AND_WINDOW
    + """
local limit = tonumber(ARGV[2])
local refund = tonumber(ARGV[3])
if limit > 0 and refund > 0 then
  local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  if st[1] then  -- a missing bucket is full: nothing to refund into
    local level = math.min(limit, tonumber(st[1]) + math.max(0, now - tonumber(st[2])) * limit / window)
    level = math.min(limit, level + refund)
    redis.call('HSET', KEYS[1], 'tokens', tostring(level), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[1], math.floor((limit - level) * window / limit) + 2)
  end
end
if ARGV[4] ~= '' then redis.call('ZREM', KEYS[2], ARGV[4]) end
return 1
"""
)


# KEYS: concurrency key. ARGV: lease_ttl, lease. Extends a live lease (XX: a gone one stays gone).
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[2]) == 1 then
  redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 2)
end
return 1
"""


class RedisLimiter:
    def __init__(
        self,
        url: str,
        prefix: str = "sluice",
        lease_ttl_s: float = 900.0,
        window_s: float = WINDOW_S,
        max_connections: int = 64,
    ):
        # Short timeouts: a limiter that hangs would stall every request behind it. A blocking
        # pool: a burst waits briefly for a connection instead of failing with "too many".
        self.redis = redis_client(url, max_connections=max_connections)
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        self.window_s = window_s
        self._acquire = self.redis.register_script(ACQUIRE)
        self._settle = self.redis.register_script(SETTLE)
        self._renew = self.redis.register_script(RENEW)

    def _key(self, key: str, dim: str) -> str:
        return f"{self.prefix}:rl:{{{key}}}:{dim}"  # {key}: one hash slot per key on Redis Cluster

    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision:
        costs = {"requests": 1, "input_tokens": input_tokens, "output_tokens": output_tokens}
        dims = list(limits.buckets().items())
        lease = uuid.uuid4().hex if limits.max_concurrent is not None else ""
        keys = [self._key(key, d) for d, _ in dims] + [self._key(key, "concurrency")]
        argv: list = [
            self.window_s,
            self.lease_ttl_s,
            -1 if limits.max_concurrent is None else limits.max_concurrent,
            lease,
        ]
        for dim, limit in dims:
            argv += [limit, costs[dim]]
        res = await self._acquire(keys=keys, args=argv)
        allowed, retry, reason = int(res[0]) == 1, float(res[1]), res[2]
        if reason.isdigit():
            reason = dims[int(reason) - 1][0]
        reason = LimitReason(reason)
        states = {}
        for (dim, limit), left in zip(dims, res[3:]):
            left_f = float(left)
            states[dim] = BucketState(limit, left_f, reset_s(left_f, limit, self.window_s))
        return Decision(allowed, retry, states, reason, (lease or None) if allowed else None)

    async def settle(
        self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None
    ) -> None:
        refund = max(0, reserved_output - actual_output)
        if not (limits.otpm and refund) and lease is None:
            return  # nothing to give back: skip the round trip
        keys = [self._key(key, "output_tokens"), self._key(key, "concurrency")]
        await self._settle(keys=keys, args=[self.window_s, limits.otpm or -1, refund, lease or ""])

    async def renew(self, key: str, lease: str) -> None:
        await self._renew(keys=[self._key(key, "concurrency")], args=[self.lease_ttl_s, lease])

    async def close(self) -> None:
        await self.redis.aclose()
