"""The Prometheus rules in deploy/prometheus/: checked and unit-tested by the real `promtool`
(Debian's `prometheus` package; `make install` installs it), and the tests shown to catch an
alert that would page for noise."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from deploy.tools import prometheus_rules
from tests.paths import ROOT

RULES = ROOT / "deploy" / "prometheus" / "sluice-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "sluice-rules.test.yml"
PROMTOOL = shutil.which("promtool") or ""  # "": not installed, the tests are skipped
pytestmark = pytest.mark.skipif(not PROMTOOL, reason="promtool is not installed (Debian package `prometheus`)")


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=300)


def test_rules_pass_promtool_check():
    out = _promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rule_unit_tests_pass():
    out = _promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_unit_tests_catch_alerts_that_would_page_for_noise(tmp_path, monkeypatch):
    """Two broken variants in one promtool run (each run costs seconds of CPU):
    - no short window (the long one twice): the fixed incident keeps paging for an hour
      (the 7h10m case must fail);
    - no event floor: a handful of failures at night pages someone (the 5h case must fail)."""
    one_window = tuple(
        prometheus_rules.BurnAlert(a.severity, a.long, a.long, a.burn) for a in prometheus_rules.BURN_ALERTS
    )
    monkeypatch.setattr(prometheus_rules, "BURN_ALERTS", one_window)
    monkeypatch.setattr(prometheus_rules, "MIN_EVENTS", 0)
    (tmp_path / "tests").mkdir()
    (tmp_path / "sluice-rules.yml").write_text(yaml.safe_dump(prometheus_rules.rule_groups(), sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    out = _promtool("test", "rules", str(tmp_path / "tests" / RULE_TESTS.name))
    report = out.stdout + out.stderr
    assert out.returncode != 0
    assert "SluiceAvailabilityBudgetBurnFast, time: 7h10m" in report
    assert "SluiceAvailabilityBudgetBurnFast, time: 5h," in report
