"""The one place sluice reaches into uvicorn's private httptools protocol.

Three servers subclass uvicorn's `HttpToolsProtocol` (uvicorn.protocols.http.httptools_impl), a
class uvicorn does not document as API: serving's (api/connection_watch.py: a watch over each
connection, limits on reading a request), the search shard's (search/shard/query_protocol.py:
query requests answered inside the parser's callbacks) and the search router's
(search/router/http/search_protocol.py: POST /v1/search answered from them, its search
stepped there and carried on by a task when it waits). They override its parser callbacks
and use its per-connection state (`transport`, `loop`, `parser`, `url`, `scope`, `cycle`,
`expect_100_continue`; the router's also `headers`, `flow`, `tasks`, `server_state`,
`limit_concurrency`), as uvicorn 0.55 has them: pyproject.toml pins uvicorn (and httptools,
whose parser they call) to the range they were written and tested against.

Should another uvicorn differ anyway, `httptools_protocol()` says so instead of letting a
subclass fail on a live connection: it returns the class only when it imports and has every
method the subclasses override or call, else None, and each server then runs on uvicorn's own
protocol without its extras (a warning says which), rather than not at all.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

log = logging.getLogger("sluice.server")

# the methods the subclasses override or call on uvicorn's class (its instance attributes are
# set in __init__, so they cannot be checked on the class)
HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_url",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
)


def httptools_protocol() -> type | None:
    """uvicorn's httptools protocol class when it is the one sluice's subclasses were written
    against, else None."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools missing, or uvicorn moved it
        return None
    if not all(callable(getattr(HttpToolsProtocol, name, None)) for name in HOOKS):
        return None
    return HttpToolsProtocol


def fallback_warning(server: str, lost: str) -> None:
    log.warning(
        "%s: uvicorn's httptools protocol is not the one sluice was written against "
        "(pyproject.toml pins uvicorn); serving with uvicorn's default protocol, without %s",
        server,
        lost,
    )


class AnsweredInside:
    """What the search router's and the shard's protocols share: a request that `claim()` takes
    at its headers (it returns the request's state; None leaves the request to uvicorn) has its
    body handed to `take(state, chunk)` and is answered by `complete(state)`, all from the
    parser's callbacks; every other request goes through uvicorn's own callbacks unchanged. Only
    plain posts are offered (`plain_post`). Mixed in ahead of uvicorn's class:
    `class P(AnsweredInside, httptools_protocol())`."""

    _inside: Any = None  # the claimed request's state while its body is read

    def claim(self) -> Any:
        raise NotImplementedError

    def take(self, state: Any, body: bytes) -> None:
        raise NotImplementedError

    def complete(self, state: Any) -> None:
        raise NotImplementedError

    def on_message_begin(self) -> None:
        self._inside = None
        super().on_message_begin()  # type: ignore[misc]

    def on_headers_complete(self) -> None:
        state = self.claim() if plain_post(self) else None
        if state is None:
            super().on_headers_complete()  # type: ignore[misc]
            return
        self._inside = state

    def on_body(self, body: bytes) -> None:
        if self._inside is None:
            super().on_body(body)  # type: ignore[misc]
            return
        self.take(self._inside, body)

    def on_message_complete(self) -> None:
        state, self._inside = self._inside, None
        if state is None:
            super().on_message_complete()  # type: ignore[misc]
            return
        self.complete(state)


def plain_post(protocol: Any) -> bool:
    """At `on_headers_complete`: the request is one a subclass may answer inside the protocol —
    a POST over HTTP/1.1, no `expect: 100-continue`, no upgrade, and nothing else in flight on
    the connection (uvicorn's own cycle, if any, answered); anything else stays uvicorn's."""
    parser = protocol.parser
    return (
        parser.get_method() == b"POST"
        and parser.get_http_version() == "1.1"
        and not protocol.expect_100_continue
        and not parser.should_upgrade()
        and (protocol.cycle is None or protocol.cycle.response_complete)
    )


def http_option(protocol: type | None, server: str, lost: str) -> dict[str, Any]:
    """The `http=` option for uvicorn.run: `protocol` when it fits the installed uvicorn (not
    None), else uvicorn's own, with a warning that `server` runs without `lost`."""
    if protocol is None:
        fallback_warning(server, lost)
        return {}
    return {"http": protocol}


# every status line, made once
STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def json_response(status: int, payload: bytes, keep_alive: bool, headers: bytes = b"") -> bytes:
    """A whole HTTP/1.1 response carrying `payload` (JSON), as the subclasses write it at once;
    `headers`: more header lines, each ending in CRLF."""
    return b"%s%scontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        STATUS_LINES[status],
        headers,
        len(payload),
        b"" if keep_alive else b"connection: close\r\n",
        payload,
    )
