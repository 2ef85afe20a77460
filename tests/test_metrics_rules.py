"""The Prometheus configuration and alert rules in deploy/prometheus/ as Prometheus's own promtool
reads them: valid, and raising exactly the alerts deploy/prometheus/alerts_test.yml expects.

promtool is not on PyPI; Debian's `prometheus` package ships it (`apt-get install prometheus`;
.ci/run installs it when it is missing).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: apt-get install --no-install-recommends prometheus"
    return found


def run(promtool: str, *args: str) -> str:
    done = subprocess.run([promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_alert_rules_are_valid(promtool: str) -> None:
    assert "SUCCESS: 8 rules found" in run(promtool, "check", "rules", "alerts.yml")


def test_the_scrape_configuration_is_valid_and_loads_the_rules(promtool: str) -> None:
    out = run(promtool, "check", "config", "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in out


def test_the_alerts_fire_as_their_unit_tests_expect(promtool: str) -> None:
    assert "SUCCESS" in run(promtool, "test", "rules", "alerts_test.yml")
