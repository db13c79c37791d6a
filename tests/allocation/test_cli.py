"""`tangram allocate` over simulated machines: JSON lines per decision and a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tangram.cli import main

TRACE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: two, namespace: ml}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.tangram.dev, count: 2}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: nine, namespace: ml}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.tangram.dev, count: 9}
---
op: delete
claim: ml/two
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: again, namespace: ml}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.tangram.dev, count: 2}
"""


def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, Any]]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {name: l, machine: l40s-8, count: 2}\n")
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    assert main(["allocate", "--fleet", str(fleet), "--trace", str(trace), *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("policy", ["tangram", "first-fit", "best-fit"])
def test_allocate_prints_decisions_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    lines = run_cli(tmp_path, capsys, "--policy", policy)
    assert [line.get("claim") for line in lines[:3]] == ["ml/two", "ml/nine", "ml/again"]
    assert lines[0]["status"] == "allocated" and lines[0]["node"] == "l-0"
    assert [d["gpu"] for d in lines[0]["devices"]] == [0, 1]
    assert lines[1]["status"] == "failed"
    assert (
        lines[1]["reason"]
        == '0/2 nodes fit: 2 nodes: request "gpus": only 8 devices of this hardware match (needs 9)'
    )
    assert lines[2]["node"] == "l-0"
    summary = lines[3]["summary"]
    assert summary["admitted"] == 2 and summary["failed"] == 1
    assert summary["multi_gpu_nvlink_optimal_share"] == 1.0


def test_explain_lists_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_cli(tmp_path, capsys, "--explain")
    assert lines[0]["explanation"][0].startswith("chosen l-0 (demand-weighted loss ")
    why = lines[0]["why"]
    assert why["policy"] == "tangram"
    assert why["claim_kind"] == '2 x class "gpu.tangram.dev"'
    assert why["chosen"]["node"] == "l-0" and why["chosen"]["nodes_alike"] == 2
    # Two of eight free L40S GPUs: 8 single GPUs fit before, 6 after; four pairs before, three after.
    terms = {term["kind"]: term for term in why["terms"]}
    assert (terms["prior: 1 whole GPU"]["fits_before"], terms["prior: 1 whole GPU"]["fits_after"]) == (8, 6)
    pair = terms['2 x class "gpu.tangram.dev"']
    assert (pair["fits_before"], pair["fits_after"]) == (4, 3)
    assert why["chosen"]["loss"] == pytest.approx(sum(term["loss"] for term in why["terms"]), abs=1e-5)
    assert "why" not in lines[1]  # nothing fits: the failure reason says why


def test_bad_fleet_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {name: x}\n")
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    assert main(["allocate", "--fleet", str(fleet), "--trace", str(trace)]) == 2
    assert "node [0]: needs name (string) and machine" in capsys.readouterr().err


def test_a_claim_asked_again_gets_the_same_decision_counted_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {name: l, machine: l40s-8}\n")
    trace = tmp_path / "trace.yaml"
    first = TRACE.split("---", maxsplit=1)[0]
    trace.write_text(first + "---" + first)
    assert main(["allocate", "--fleet", str(fleet), "--trace", str(trace)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["devices"] == lines[1]["devices"] and lines[1]["status"] == "allocated"
    assert lines[2]["summary"]["admitted"] == 1 and lines[2]["summary"]["free_gpus"] == 6
