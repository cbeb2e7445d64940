"""The router's ASGI front: POST /v1/search answered in front of FastAPI, and the last line
for any exception.

Measured under one load, FastAPI's handling of a search (routing, the request model, dependency
solving, the response class) cost the router about as much CPU as the whole two-phase fan-out
over 2 shards. So this layer answers every POST /v1/search itself, through the same function
as the FastAPI route (search_endpoint.py: key, bounded body, decoding, search), and renders
its refusals in the API's one error shape. Everything else goes to FastAPI. (The router's
server answers most searches before they reach ASGI at all, inside uvicorn's protocol through
the same functions: search_protocol.py; this layer answers those it leaves, such as a search
with `expect: 100-continue`, and all of them where that protocol does not fit uvicorn.)

Any exception that escapes either is answered here, if no response has started, with a 500
in the error shape and `connection: close` (responses.py), and logged; after a response has
started the connection is the server's to drop.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.search.errors import SearchError
from sluice.search.router.http.responses import internal_error, send_error, send_json
from sluice.search.router.http.search_endpoint import answer_search
from sluice.search.router.runtime import RouterRuntime

log = logging.getLogger("sluice.search.router")


class RouterFront:
    def __init__(self, app: ASGIApp, rt: RouterRuntime):
        self.app, self.rt = app, rt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == "/v1/search" and scope.get("method") == "POST":
            await self._search(scope, receive, send)
            return
        state = {"started": False, "done": False}

        async def watched(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                state["started"] = True
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                state["done"] = True
            await send(msg)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if not state["started"]:
                self.rt.metrics.refused(internal_error().kind.value)
                await send_error(send, internal_error())
            elif not state["done"]:
                raise  # a response cut short: the server drops the connection
            # else: FastAPI's handler already answered 500 with connection: close (app.py)

    async def _search(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            payload = await answer_search(self.rt, Request(scope, receive))
        except SearchError as refused:
            err = refused
        except Exception:
            log.exception("POST /v1/search failed")
            err = internal_error()
        else:
            await send_json(send, 200, payload)
            return
        self.rt.metrics.refused(err.kind.value)
        await send_error(send, err)
