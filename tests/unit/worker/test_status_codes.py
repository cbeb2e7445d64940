"""Failed gRPC calls map onto the errors failover tells apart: a worker that cannot serve now
(taken down at once), a call past its deadline (left to the probes), a request the worker
refused for itself alone (left to the breaker)."""

from __future__ import annotations

import grpc
import pytest

from sluice.errors import EngineRefusedError, EngineTimeoutError, EngineUnavailableError
from sluice.worker.status_codes import REFUSED_TRAILERS, error_from


def rpc_error(code: grpc.StatusCode, details: str, trailers: tuple = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailers), details)


@pytest.mark.parametrize(
    "code, details, trailers, kind",
    [
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", (), EngineUnavailableError),
        (grpc.StatusCode.UNAVAILABLE, "worker draining", (), EngineUnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", (), EngineTimeoutError),
        (grpc.StatusCode.UNAVAILABLE, "injected fault: fail_all", REFUSED_TRAILERS, EngineRefusedError),
    ],
)
def test_each_failure_maps_to_what_it_says_about_the_worker(code, details, trailers, kind):
    exc = error_from(rpc_error(code, details, trailers))
    assert type(exc) is kind
