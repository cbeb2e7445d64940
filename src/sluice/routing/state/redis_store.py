"""Live routing state in Redis: one hash of per-model JSON, per-model revisions, a global one.

    {prefix:routing}:state   hash  model id → ModelRoutingState JSON (without its revision)
    {prefix:routing}:revs    hash  model id → revision (kept on delete: CAS stays monotonic)
    {prefix:routing}:rev     int   bumped by every write: the one key followers poll

A write is one Lua script (check the model's revision, write, bump both counters), so two
gateways that race on one model cannot both win; a read is one MULTI of HGETALL, HGETALL, GET,
so a snapshot never mixes two writes. The three keys share a hash tag (one Cluster slot).
No TTL: the state lives as long as the fleet does; `delete` removes a model's entry. A Redis
that restarts empty gets the state back from the gateways (`restore`, state_follower.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sluice.redis_client import redis_client
from sluice.routing.errors import StateConflictError
from sluice.routing.state.routing_state import ModelRoutingState, RoutingSnapshot

# KEYS: state, revs, rev. ARGV: model, json, expected revision ('' = any).
# Returns {1, new model revision} or {0, current model revision}.
PUT = """
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if ARGV[3] ~= '' and tonumber(ARGV[3]) ~= cur then return {0, cur} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], cur + 1)
redis.call('INCR', KEYS[3])
return {1, cur + 1}
"""

# KEYS: state, revs, rev. ARGV: model.
DELETE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  redis.call('INCR', KEYS[3])
end
return 1
"""

# KEYS: state, revs, rev. ARGV: global revision, then (model, json, model revision) triples.
# Writes only into an empty store (no global revision: a Redis restarted without its data).
RESTORE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
for i = 2, #ARGV, 3 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
end
redis.call('SET', KEYS[3], ARGV[1])
return 1
"""


class RedisRoutingStateStore:
    def __init__(self, url: str, prefix: str = "sluice", clock: Callable[[], float] = time.time):
        self.redis = redis_client(url, max_connections=8)
        self._clock = clock
        tag = f"{{{prefix}:routing}}"
        self._keys = [f"{tag}:state", f"{tag}:revs", f"{tag}:rev"]
        self._put = self.redis.register_script(PUT)
        self._delete = self.redis.register_script(DELETE)
        self._restore = self.redis.register_script(RESTORE)

    async def revision(self) -> int:
        return int(await self.redis.get(self._keys[2]) or 0)

    async def load(self) -> RoutingSnapshot:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._keys[0])
            pipe.hgetall(self._keys[1])
            pipe.get(self._keys[2])
            states, revs, rev = await pipe.execute()
        models = {m: ModelRoutingState.from_json(text, int(revs.get(m, 0))) for m, text in states.items()}
        return RoutingSnapshot(int(rev or 0), models)

    async def put(
        self, model_id: str, state: ModelRoutingState, expect_revision: int | None = None
    ) -> ModelRoutingState:
        stamped = ModelRoutingState(state.weights, state.versions, state.rollout, 0, self._clock())
        ok, rev = await self._put(
            keys=self._keys, args=[model_id, stamped.to_json(), "" if expect_revision is None else expect_revision]
        )
        if not int(ok):
            raise StateConflictError(f"routing state of {model_id!r} is at revision {rev}, not {expect_revision}")
        return ModelRoutingState(stamped.weights, stamped.versions, stamped.rollout, int(rev), stamped.updated_at)

    async def delete(self, model_id: str) -> None:
        await self._delete(keys=self._keys, args=[model_id])

    async def restore(self, snapshot: RoutingSnapshot) -> bool:
        args: list[str | int] = [snapshot.revision]
        for model_id, state in snapshot.models.items():
            args += [model_id, state.to_json(), state.revision]
        return bool(int(await self._restore(keys=self._keys, args=args)))

    async def close(self) -> None:
        await self.redis.aclose()
