"""The one way sluice opens a Redis client, for every store that keeps shared state there
(limits, quotas, routing state, idempotency keys, stream replay).

Short timeouts everywhere: a store that hangs would stall every request behind it, so a
command that gets no answer within `socket_timeout_s` fails and the caller applies its
`on_store_error` rule. A blocking pool: a burst waits briefly (`pool_timeout_s`) for a
connection instead of failing with "too many connections". Replies are decoded as text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

SOCKET_TIMEOUT_S = 1.0  # one command's answer
CONNECT_TIMEOUT_S = 1.0
POOL_TIMEOUT_S = 2.0  # waiting for a free connection of the pool


def redis_client(url: str, *, max_connections: int = 32, socket_timeout_s: float = SOCKET_TIMEOUT_S) -> aioredis.Redis:
    """An asyncio Redis client on its own bounded pool (redis is imported here, on first use:
    a gateway without Redis never loads it)."""
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_TIMEOUT_S,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        decode_responses=True,
    )
    return aioredis.Redis(connection_pool=pool)
