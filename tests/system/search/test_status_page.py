"""The search router's status page in a real headless browser (Debian's chromium, Playwright):
it shows each shard's p50 and p99, the time since its last write, the cache hit rate and the
query errors by type, and the browser logs no error (no favicon 404)."""

from __future__ import annotations

import shutil

import httpx
import pytest

from tests.system.search.cluster import ingest, search, start_router

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make install installs it)")
def test_the_status_page_shows_the_spec_figures_without_console_errors(tmp_path):
    from playwright.sync_api import sync_playwright

    router = start_router(tmp_path)
    try:
        ingest(router.url, [{"id": "a", "title": "apt", "body": "package manager"}, {"id": "b", "body": "grep"}])
        search(router.url, "package")
        search(router.url, "package")  # a cache hit
        assert httpx.post(router.url + "/v1/search", json={"query": "x", "top_k": 101}, timeout=30).status_code == 400
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(router.url + "/status")
            page.wait_for_function(
                "document.getElementById('errors').textContent.includes('invalid_request_error 1')", timeout=60_000
            )
            shard = page.inner_text("h2.shard")
            assert "p50" in shard and "p99" in shard and "last write applied" in shard and "s ago" in shard
            assert "hit rate 0.5" in page.inner_text("#summary")
            page.wait_for_timeout(2500)  # one refresh more
            browser.close()
        assert not problems, problems
    finally:
        router.stop()
