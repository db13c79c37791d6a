"""The shipped Prometheus rules pass `promtool check rules`, and `promtool test rules` proves what
they record and when they alert (tests/telemetry/tangram.rules_test.yaml). promtool comes with
Debian's prometheus package, which `make test` installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "helm" / "tangram" / "files" / "prometheus" / "tangram.rules.yaml"
RULE_TESTS = Path(__file__).with_name("tangram.rules_test.yaml")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    assert found is not None, "promtool missing: `make prometheus` installs Debian's prometheus package"
    return found


def test_the_rules_pass_promtool_check(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout


def test_the_rules_do_what_their_unit_tests_say(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_and_says_what_to_do() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
    }
    assert set(alerts) == tested
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_a_broken_rule_fails_promtool(promtool: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - record: a:b:c\n        expr: sum by (\n")
    result = subprocess.run(
        [promtool, "check", "rules", str(broken)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
