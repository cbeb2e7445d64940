"""The status page in a real headless browser (Debian's chromium, driven by Playwright): it loads,
shows the running workers, plots latency, and updates when a worker is killed and comes back."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time

import httpx
import pytest

from tests.server_process import start_server

pytestmark = pytest.mark.slow
ADMIN = "status-admin-key-0123456789"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make install installs it)")
def test_the_status_page_shows_the_fleet_and_follows_a_worker_dying(tiny_llama_dir):
    from playwright.sync_api import sync_playwright

    proc = start_server(["--model", str(tiny_llama_dir)], env={"SLUICE_ADMIN_KEY": ADMIN})
    try:
        r = httpx.get(proc.base_url + "/status")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")  # a browser asks for the key
        model = httpx.get(proc.base_url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(proc.base_url + "/v1/messages", json=body).status_code == 200  # something to plot
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(http_credentials={"username": "admin", "password": ADMIN})
            page = context.new_page()
            page.goto(proc.base_url + "/status")
            row = page.wait_for_selector('#workers tbody tr[data-state="warm"]', timeout=60_000)
            assert model in row.inner_text()
            assert page.inner_text("#versions tbody").count("default") == 1
            assert page.is_visible("#no-autoscaling") and not page.inner_text("#autoscaling tbody")  # none here
            data = httpx.get(proc.base_url + "/status/data", auth=("admin", ADMIN)).json()
            assert list(data["gateway"]["scaling_signals"]) == [model]  # per model, as exported
            assert page.inner_text("#signal") == f"{data['gateway']['scaling_signals'][model]:.2f}"
            page.wait_for_selector("#chart path", state="attached", timeout=60_000)  # the TTFT line has a point
            _check_latency_axes(
                page, httpx.get(proc.base_url + "/status/data", auth=("admin", ADMIN)).json()["latency"]
            )
            pid = int(page.inner_text("#workers tbody tr td:nth-child(7)"))
            os.kill(pid, signal.SIGKILL)
            page.wait_for_selector('#workers tbody tr:not([data-state="warm"])', timeout=120_000)  # it shows the loss
            page.wait_for_selector('#workers tbody tr[data-state="warm"]', timeout=300_000)  # and the restart
            deadline = time.monotonic() + 60
            while page.inner_text("#workers tbody tr td:nth-child(8)") != "1":  # restarts: 1
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert "never" not in page.inner_text("#updated") and not page.inner_text("#error")
            browser.close()
    finally:
        proc.stop()


def _check_latency_axes(page, latency: list[dict]) -> None:
    """Both axes of the latency plot are labelled with their units (issue 21): time on x, TTFT
    and ITL each on its own y axis in ms (no unexplained "× 10" scaling), and the TTFT axis
    reaches the highest TTFT plotted."""
    texts = page.eval_on_selector_all(
        "#chart text", "els => els.map(e => [e.dataset.axis, e.getAttribute('class'), e.textContent])"
    )
    titles = {axis: text for axis, kind, text in texts if kind == "axis-title"}
    assert titles == {
        "time": "time (minutes before now)",
        "ttft": "time to first token (ms)",
        "itl": "inter-token latency (ms)",
    }
    ticks: dict[str, list[str]] = {}
    for axis, kind, text in texts:
        if kind == "tick":
            ticks.setdefault(axis, []).append(text)
    assert ticks["time"] == ["−5 min", "−4 min", "−3 min", "−2 min", "−1 min", "now"]
    for axis in ("ttft", "itl"):
        assert len(ticks[axis]) >= 2 and all(re.fullmatch(r"\d+(\.\d+)? ms", t) for t in ticks[axis]), ticks[axis]
    top_ms = max(float(t.removesuffix(" ms")) for t in ticks["ttft"])
    assert max(r["ttft_p50"] for r in latency if r["ttft_p50"] is not None) * 1000 <= top_ms
    assert "× 10" not in page.inner_text("body")
