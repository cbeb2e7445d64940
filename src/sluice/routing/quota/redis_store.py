"""Token quotas in Redis, shared by every gateway replica (quota/semantics.py has the semantics).

One hash per (tenant, model) holding the period id and the tokens used in it; each operation
is one Lua script, so check-and-reserve is atomic on the server. The period comes from Redis
server TIME (replica clocks do not matter), computed in Lua with the same calendar as
quota.period_window (days since the epoch; months by Howard Hinnant's civil-from-days). A hash
whose stored period is not the current one reads as zero and is overwritten by the next
reservation, so a reset needs no sweeper; the TTL (reset + 1 h) only frees memory.

Only the one key a script touches is passed in KEYS, so the scripts also run on Redis Cluster.
`clock` replaces Redis TIME with a given time: a testing aid for period boundaries, off by
default.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.redis_client import redis_client
from sluice.routing.fleet_file.schema import TokenQuotaSpec
from sluice.routing.quota.semantics import (
    KEEP_AFTER_RESET_S,
    QuotaDecision,
    QuotaReservation,
    QuotaStatus,
    exceeded_status,
)

# KEYS: the counter. ARGV: limit, tokens, op (take | force | peek), period (day | month),
# now ('' = Redis TIME). Returns {status (ok | over), used, reset_at, period_id, now}.
ACQUIRE = """
local now
if ARGV[5] ~= '' then now = tonumber(ARGV[5]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local day = math.floor(now / 86400)
local pid, reset
if ARGV[4] == 'day' then
  pid = 'd' .. string.format('%d', day); reset = (day + 1) * 86400
else
  local z = day + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  pid = 'm' .. string.format('%d', y * 12 + m - 1)
  local ny, nm = y, m + 1
  if nm > 12 then ny = y + 1; nm = 1 end
  reset = days_from_civil(ny, nm, 1) * 86400
end
local limit = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local op = ARGV[3]
local st = redis.call('HMGET', KEYS[1], 'pid', 'used')
local used = 0
if st[1] == pid then used = tonumber(st[2]) end
local status = 'ok'
if used >= limit then status = 'over' end
if op ~= 'peek' and (status == 'ok' or op == 'force') then
  used = used + tokens
  redis.call('HSET', KEYS[1], 'pid', pid, 'used', string.format('%d', used))
  redis.call('EXPIRE', KEYS[1], math.ceil(reset - now) + tonumber(ARGV[6]))
end
return {status, string.format('%d', used), string.format('%d', reset), pid, tostring(now)}
"""

# KEYS: the counter. ARGV: period id of the reservation, actual − reserved.
SETTLE = """
local st = redis.call('HMGET', KEYS[1], 'pid', 'used')
if st[1] == ARGV[1] then
  local used = math.max(0, tonumber(st[2]) + tonumber(ARGV[2]))
  redis.call('HSET', KEYS[1], 'used', string.format('%d', used))
end
return 1
"""


class RedisQuotaStore:
    def __init__(
        self, url: str, prefix: str = "sluice", clock: Callable[[], float] | None = None, max_connections: int = 32
    ):
        self.redis = redis_client(url, max_connections=max_connections)
        self.prefix = prefix
        self._clock = clock
        self._acquire = self.redis.register_script(ACQUIRE)
        self._settle = self.redis.register_script(SETTLE)

    def _key(self, tenant: str, model_id: str) -> str:
        # length-prefixed: no tenant/model pair can spell another pair's key
        return f"{self.prefix}:quota:{len(tenant)}:{tenant}:{model_id}"

    async def _call(self, tenant: str, model_id: str, quota: TokenQuotaSpec, tokens: int, op: str) -> QuotaDecision:
        now = "" if self._clock is None else repr(float(self._clock()))
        res = await self._acquire(
            keys=[self._key(tenant, model_id)],
            args=[quota.tokens, tokens, op, quota.period.value, now, KEEP_AFTER_RESET_S],
        )
        over, used, reset_at, period_id, server_now = (
            res[0] == "over",
            int(res[1]),
            float(res[2]),
            res[3],
            float(res[4]),
        )
        status = exceeded_status(quota) if over else QuotaStatus.OK
        reserved = op != "peek" and (not over or op == "force")
        reservation = QuotaReservation(tenant, model_id, period_id, tokens) if reserved else None
        return QuotaDecision(status, quota.tokens, used, reset_at, max(0.0, reset_at - server_now), reservation)

    async def acquire(
        self, tenant: str, model_id: str, quota: TokenQuotaSpec, tokens: int, *, force: bool = False
    ) -> QuotaDecision:
        return await self._call(tenant, model_id, quota, tokens, "force" if force else "take")

    async def settle(self, reservation: QuotaReservation, actual_tokens: int) -> None:
        delta = actual_tokens - reservation.tokens
        if delta:
            await self._settle(
                keys=[self._key(reservation.tenant, reservation.model_id)], args=[reservation.period_id, delta]
            )

    async def usage(self, tenant: str, model_id: str, quota: TokenQuotaSpec) -> QuotaDecision:
        return await self._call(tenant, model_id, quota, 0, "peek")

    async def close(self) -> None:
        await self.redis.aclose()
