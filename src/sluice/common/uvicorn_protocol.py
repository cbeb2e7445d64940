"""The one place sluice reaches into uvicorn's private httptools protocol.

Three servers subclass uvicorn's `HttpToolsProtocol` (uvicorn.protocols.http.httptools_impl), a
class uvicorn does not document as API: serving's (api/connection_watch.py: a watch over each
connection, limits on reading a request), the search shard's (search/shard/query_protocol.py:
query requests answered inside the parser's callbacks) and the search router's
(search/router/http/search_protocol.py: POST /v1/search answered from them, its search a task).
They override its parser callbacks and use its per-connection state (`transport`, `loop`,
`parser`, `url`, `scope`, `cycle`, `expect_100_continue`; the router's also `headers`, `flow`,
`tasks`, `server_state`, `limit_concurrency`), as uvicorn 0.55 has them: pyproject.toml pins uvicorn (and httptools,
whose parser they call) to the range they were written and tested against.

Should another uvicorn differ anyway, `httptools_protocol()` says so instead of letting a
subclass fail on a live connection: it returns the class only when it imports and has every
method the subclasses override or call, else None, and each server then runs on uvicorn's own
protocol without its extras (a warning says which), rather than not at all.
"""

from __future__ import annotations

import logging

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
