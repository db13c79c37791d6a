"""`tangram bench e2e` on a short run: every claim accounted for, each stage timed (no timing
asserted: the figures are the benchmark's to report)."""

from __future__ import annotations

import argparse
import json

import pytest

from tangram.bench import e2e

pytestmark = pytest.mark.timeout(240)


def test_every_claim_is_decided_prepared_and_timed_stage_by_stage(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    args = parser.parse_args(["--rate", "10", "--duration", "3", "--nodes", "1", "--mix", "mixed"])
    assert e2e.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["claims"] == 30
    assert report["outcomes"] == {"ready": 30}
    assert report["claim_to_ready"]["count"] == 30
    stages = report["stages"]
    for stage in ("publish_ms", "decision_ms", "allocator_ms", "prepare_rpc_ms", "prepare_ms"):
        assert stages[stage]["count"] == 30, stage
    # every claim whose decision waited for a MIG instance to be made saw it made
    assert stages["partition_ms"]["count"] == report["waited_for_a_partition"] < 30
    assert stages["decision_ms"]["p50_ms"] <= report["claim_to_ready"]["p50_ms"]
    assert report["bus_floor"]["count"] == 30
    assert report["p50_over_bus_floor"] > 1
    assert "services_died" not in report
    # where the CPU went, per kind of process: every kind that handles each claim used some
    cpu = report["cpu_ms_per_claim"]
    assert set(cpu) == {"allocator", "discovery", "partitioner", "cdi", "nats-server", "bench", "total"}
    assert all(cpu[kind] > 0 for kind in ("allocator", "cdi", "nats-server", "bench"))
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"), abs=0.01)
    assert report["cpu_cores_busy"] > 0
