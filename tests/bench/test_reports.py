"""The benchmarks' JSON on small sizes: the documented keys and relations that must hold (no timing)."""

from __future__ import annotations

import argparse
import json

import pytest

from tangram.bench import allocator, quality, rebuild
from tangram.natsserver import NatsServer


def parse(module: object, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)  # type: ignore[attr-defined]
    return parser.parse_args(list(argv))


def test_allocator_report_counts_every_decision_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert allocator.run(parse(allocator, "--nodes", "3", "--claims", "60", "--seed", "4")) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["gpus"], report["devices"]) == (24, 3 * 8 * 26)  # 1 whole + 25 placements per GPU
    assert set(report["policies"]) == {"tangram", "first-fit", "best-fit"}
    for figures in report["policies"].values():
        assert figures["decisions"] == 60 == figures["admitted"] + figures["failed"]
        assert figures["p50_decision_ms"] <= figures["p99_decision_ms"] <= figures["max_decision_ms"]
    assert set(report["ratios"]) == {"tangram/first-fit", "tangram/best-fit"}
    assert set(report["ratios"]["tangram/first-fit"]) == {"decisions_per_s", "p99_decision_ms", "admitted"}


def test_allocator_rejects_a_gpu_count_the_machine_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    assert allocator.run(parse(allocator, "--nodes", "1", "--claims", "5", "--gpus-per-node", "4")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--gpus-per-node 4" in captured.err and "has 8 GPUs" in captured.err


def test_quality_report_never_beats_the_optimum(capsys: pytest.CaptureFixture[str]) -> None:
    assert quality.run(parse(quality, "--instances", "2", "--churn-claims", "20", "--seed", "3")) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object: the solver's banner went elsewhere
    assert len(report["instances"]) == 2
    for instance in report["instances"]:
        optimum = instance["optimum"]
        assert optimum["proven"] is True
        assert optimum["admitted"] <= instance["alive_at_saturation"]
        for figures in instance["policies"].values():
            assert figures["admitted"] + figures["failed"] == instance["arrivals"]
            assert figures["alive_admitted_at_saturation"] <= optimum["admitted"]
            assert 0.0 <= figures["optimum_share"] <= 1.0
    assert set(report["summary"]) == {"tangram", "first-fit", "best-fit"}
    assert set(report["meets_targets"]) == {"optimum_share", "fewer_stranded_than_first_fit"}


def test_rebuild_replays_every_event_into_the_live_state(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(rebuild, "--claims", "150", "--nodes", "2", "--nats-url", nats_server.url)
    assert rebuild.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    events = report["events"]
    assert events["NodeInventory"] == 2 and events["ClaimRequested"] == 150
    assert events["ClaimAllocated"] + events["ClaimFailed"] == 150
    assert report["replayed_events"] == events["total"]
    assert report["state_matches_live"] is True
    for figure in ("fold", "replay_and_fold", "bus_floor"):
        assert report[figure]["events_per_s"] > 0
