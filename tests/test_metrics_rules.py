"""The Prometheus configuration and alert rules in deploy/prometheus/ as Prometheus's own promtool
reads them: valid, and raising exactly the alerts deploy/prometheus/alerts_test.yml expects; the
Grafana dashboard's queries parse, and Grafana finds it and its data source where compose mounts them.

promtool is not on PyPI; Debian's `prometheus` package ships it (`apt-get install prometheus`;
.ci/run installs it when it is missing).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "onceflow.json"


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


def test_every_dashboard_query_is_promql_that_promtool_parses(promtool: str, tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(expressions) >= 10
    # Each query as a recording rule: `check rules` parses (and lints) every expression.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(expressions)],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(expressions)} rules found" in run(promtool, "check", "rules", str(path))


def test_grafana_finds_the_dashboard_and_its_data_source_where_compose_mounts_them() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["grafana"]
    mounts = dict(
        volume.removesuffix(":ro").split(":", 1) for volume in compose["volumes"] if volume.startswith("./")
    )
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/onceflow.yml").read_text())
    assert mounts["./deploy/grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    sources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    used = {p["datasource"]["uid"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert used == {source["uid"]}
    assert source["url"] == "http://prometheus:9090"
