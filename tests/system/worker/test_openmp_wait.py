"""The processes that run an engine start torch's OpenMP passive (sluice/openmp_wait.py): a real
`sluice worker` and a `sluice serve --worker inline` (the engine in the serving process). libgomp
prints its settings when torch loads it under OMP_DISPLAY_ENV=verbose; GOMP_SPINCOUNT is 0 when
its threads sleep at once after a region, 300000 by default (tests/openmp_display.py)."""

from __future__ import annotations

import pytest

from tests.openmp_display import gomp_spin_count
from tests.server_process import free_port, start_server, start_worker


@pytest.fixture
def display_openmp(monkeypatch):
    monkeypatch.setenv("OMP_DISPLAY_ENV", "verbose")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)


def test_a_worker_runs_openmp_passive(display_openmp, tiny_llama_dir):
    proc = start_worker(f"127.0.0.1:{free_port()}", ["--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05"])
    try:
        assert gomp_spin_count(proc.log()) == "0"
    finally:
        proc.stop()


def test_an_inline_engine_in_serve_runs_openmp_passive(display_openmp, tiny_llama_dir):
    proc = start_server(["--worker", "inline", "--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05"])
    try:
        assert gomp_spin_count(proc.log()) == "0"
    finally:
        proc.stop()


def test_a_users_own_policy_is_kept(display_openmp, monkeypatch, tiny_llama_dir):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    proc = start_worker(f"127.0.0.1:{free_port()}", ["--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05"])
    try:
        assert gomp_spin_count(proc.log()) != "0"
    finally:
        proc.stop()
