"""One API-key precedence on every surface (common/api_keys.py): `x-api-key` first, then
`Authorization: Bearer`; the same answer from serving's API, its admin API and the search router."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient
from starlette.datastructures import Headers

from sluice.common.api_keys import KeyDigests, presented_key
from sluice.gateway.authenticator import SingleKey
from tests.fuzz_app import unready_app

RIGHT, WRONG = "right-key-123", "wrong-key-456"
# (headers, does the request present RIGHT?)
CASES = [
    ({"x-api-key": RIGHT}, True),
    ({"authorization": f"Bearer {RIGHT}"}, True),
    ({"x-api-key": RIGHT, "authorization": f"Bearer {WRONG}"}, True),  # both: x-api-key wins
    ({"x-api-key": WRONG, "authorization": f"Bearer {RIGHT}"}, False),
    ({"x-api-key": "  ", "authorization": f"bearer {RIGHT}"}, True),  # blank counts as absent; any case
    ({"authorization": f"Basic {RIGHT}"}, False),  # another scheme carries no API key
    ({}, False),
]


@pytest.mark.parametrize("headers, right", CASES)
def test_the_parser_reads_x_api_key_first(headers, right):
    key = presented_key(Headers(headers))
    assert (key == RIGHT) is right
    assert KeyDigests([RIGHT]).matches(key) is right


def test_digests_match_only_a_configured_key():
    keys = KeyDigests(["a-key", "another-key"])
    assert keys.matches("another-key") and not keys.matches("a-ke") and not keys.matches(None)
    assert not KeyDigests([]) and not KeyDigests([]).matches("a-key") and len(keys) == 2


@pytest.mark.parametrize("headers, right", CASES)
def test_serving_api_and_admin_api_use_the_precedence(headers, right):
    """401 for a key that is not the right one; anything else (529: the model is loading) passed auth."""
    app, _ = unready_app(authenticator=SingleKey(RIGHT), admin_key=RIGHT)
    client = TestClient(app)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
    assert (client.post("/v1/messages/count_tokens", json=body, headers=headers).status_code != 401) is right
    assert (client.get("/admin/fleet", headers=headers).status_code != 401) is right


def test_the_admin_api_also_takes_basic_credentials():
    app, _ = unready_app(admin_key=RIGHT)
    basic = "Basic " + base64.b64encode(f"any:{RIGHT}".encode()).decode()
    assert TestClient(app).get("/admin/fleet", headers={"authorization": basic}).status_code != 401


@pytest.mark.parametrize("headers, right", CASES)
def test_the_search_router_uses_the_precedence(headers, right):
    """Searches with an API key, writes with an ingest key: both read the key the same way (the
    search router read Bearer first before: a request with both headers got the other answer)."""
    from sluice.search.router.config import parse_config
    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config(
        f'[search]\napi_keys = ["{RIGHT}"]\ningest_keys = ["{RIGHT}-ingest"]\n'
        '[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n'
    )
    rt = RouterRuntime(cfg, [["http://127.0.0.1:9"]])  # no shard there: past auth, a search is partial
    client = TestClient(RouterFront(create_router_app(rt), rt))
    assert (client.post("/v1/search", json={"query": "a"}, headers=headers).status_code != 401) is right
    ingest = {k: v.replace(RIGHT, f"{RIGHT}-ingest") for k, v in headers.items()}
    bulk = client.post("/v1/search/documents", content=b"not json\n", headers=ingest)  # past auth: a per-line error
    assert (bulk.status_code != 401) is right
