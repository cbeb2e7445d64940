"""A real Prometheus server scrapes a real `sluice serve` and evaluates the scaling query the KEDA
ScaledObject uses (`sum(sluice:scaling_signal{model="m"})`, over the committed recording rule);
its value equals what sluice reports on /metrics (`sluice_scaling_signal{model="m"}`) and in the
autoscaler's status.

Prometheus is Debian's `prometheus` binary (the Makefile's apt helper installs it), started on a
free 127.0.0.1 port with a generated config and a temporary storage folder, stopped by its PID.
The signal is held constant by requests that wait in the worker before their first token
(fault injection), so the comparison does not race the load."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from sluice.routing.scaling.keda_scaledobject import signal_query
from tests.fleet_process import ADMIN, ADMIN_HEADERS, wait_until
from tests.paths import ROOT
from tests.server_process import free_port, metric, start_server

RULES = ROOT / "deploy" / "prometheus" / "sluice-rules.yml"
PROMETHEUS = shutil.which("prometheus") or ""  # "": not installed, the tests are skipped
HELD = 2  # requests held in flight
pytestmark = pytest.mark.skipif(not PROMETHEUS, reason="prometheus is not installed (Debian package `prometheus`)")


def fleet_text(tiny: str) -> str:
    # autoscaled with no warm pool and one worker at most: the autoscaler reports its signal
    # without changing the capacity under the comparison
    return f"""
[autoscaling]
max_workers = 1
[autoscaling.warm_pool]
windows = [{{ start = "00:00", size = 0 }}]
[models.m.versions.v1]
weights = "{tiny}"
traffic = 100
replicas = 1
autoscale = true
fault_injection = "delay_first_token_s=600"
[models.m.versions.v1.engine]
block_size = 16
num_kv_blocks = 64
"""


class Prometheus:
    def __init__(self, target: str, rules: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-prometheus-"))
        # the committed rules, evaluated every second instead of every 15 s (the test's pace)
        doc = yaml.safe_load(rules.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
        (self.dir / "rules.yml").write_text(yaml.safe_dump(doc))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.dir / "rules.yml")],
            "scrape_configs": [{"job_name": "sluice", "static_configs": [{"targets": [target]}]}],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(self.dir / "out.log", "wb")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def query(self, expr: str) -> float | None:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        result = r.json()["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def ready(self) -> bool:
        assert self.process.poll() is None, (self.dir / "out.log").read_text()
        try:
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def hold(base_url: str) -> None:
    body = {"model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}]}
    try:
        httpx.post(base_url + "/v1/messages", json=body, headers={"sluice-cache": "bypass"}, timeout=900)
    except httpx.HTTPError:
        pass  # the server stops at the end of the test


def test_prometheus_evaluates_the_keda_scaling_query_to_sluices_own_signal(tmp_path, tiny_llama_dir):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_text(str(tiny_llama_dir)))
    server = start_server(
        ["--fleet", str(fleet)], env={"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_SAFETY": "false"}, timeout=300
    )
    prometheus = None
    try:
        for _ in range(HELD):
            threading.Thread(target=hold, args=(server.base_url,), daemon=True).start()
        wait_until(
            lambda: metric(server.base_url, "sluice_gateway_inflight_requests") == HELD, "the held requests", 120
        )
        own = metric(server.base_url, "sluice_scaling_signal")
        assert f'sluice_scaling_signal{{model="m"}} {own}' in httpx.get(server.base_url + "/metrics", timeout=5).text
        assert 0 < own < 0.7  # held load, under the threshold: the autoscaler changes nothing

        def autoscaler_signal() -> float | None:
            r = httpx.get(server.base_url + "/admin/fleet", headers=ADMIN_HEADERS, timeout=30)
            return r.json()["autoscaling"][0]["signal"]

        wait_until(lambda: autoscaler_signal() == round(own, 4), "the autoscaler to report the same signal", 60)
        prometheus = Prometheus(server.base_url.removeprefix("http://"), RULES)
        wait_until(prometheus.ready, "Prometheus to start", 120)
        query = signal_query("m")  # the query the ScaledObject of m's workers runs
        value = wait_until(lambda: prometheus.query(query), f"Prometheus to evaluate {query}", 120)
        assert value == pytest.approx(own, rel=1e-9)
        assert prometheus.query(signal_query("another-model")) is None  # nothing of m's load leaks
        assert prometheus.query('sluice_engine_up{model="m",version="m/v1"}') == 1  # per-version engine gauges
        assert prometheus.query("sluice_warm_pool_workers") == 0  # exported, scraped
        assert metric(server.base_url, "sluice_scaling_signal") == own  # still held: the comparison was fair
    finally:
        if prometheus is not None:
            prometheus.stop()
        server.stop()
