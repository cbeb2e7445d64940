"""The standard gRPC health service (grpc.health.v1) on the worker: what Kubernetes' `grpc`
probes and gRPC-aware load balancers ask.

Two names, because readiness and liveness ask different questions:
- "" (the server): SERVING only while the worker takes new requests — the model is loaded and
  no drain or stop has begun. A readiness probe on it keeps loading and draining workers out
  of the Service.
- "liveness": SERVING while the process and its engine loop live, loading and draining
  included, so a liveness probe never restarts a worker in the middle of either.
The worker's own `Health` RPC (with its detail text) stays for sluice's own clients.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

LIVENESS = "liveness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class WorkerHealth:
    def __init__(self) -> None:
        self._servicer = health.aio.HealthServicer()  # the asyncio servicer

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    async def loading(self) -> None:
        await self._servicer.set("", _NOT_SERVING)
        await self._servicer.set(LIVENESS, _SERVING)

    async def ready(self) -> None:
        await self._servicer.set("", _SERVING)

    async def draining(self) -> None:
        await self._servicer.set("", _NOT_SERVING)

    async def stopped(self) -> None:
        """Everything NOT_SERVING, for good (a stopping or failed worker)."""
        await self._servicer.enter_graceful_shutdown()
