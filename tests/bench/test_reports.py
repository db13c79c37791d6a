"""The benchmarks' JSON on small sizes: the documented keys and relations that must hold (no timing)."""

from __future__ import annotations

import argparse
import json

import pytest

from tangram.bench import allocator, quality, rebuild
from tangram.local.natsserver import NatsServer


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


def test_allocator_mixed_fleet_has_three_kinds_of_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        allocator.run(parse(allocator, "--mixed", "--nodes", "10", "--claims", "40", "--policies", "tangram"))
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["fleet"] == {"hgx-h200": 4, "h100-nvl-4x2": 3, "l40s-8": 3}
    # 26 devices per MIG-capable GPU (1 whole + 25 placements) on 7 nodes, 8 whole L40S on 3.
    assert report["devices"] == 7 * 8 * 26 + 3 * 8
    assert report["policies"]["tangram"]["decisions"] == 40


def test_allocator_rejects_a_gpu_count_the_machine_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    assert allocator.run(parse(allocator, "--nodes", "1", "--claims", "5", "--gpus-per-node", "4")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--gpus-per-node 4" in captured.err and "has 8 GPUs" in captured.err


def test_quality_report_never_beats_the_optimum(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--instances", "1", "--churn-claims", "20", "--saturation", "1.0", "--seed", "3")
    assert quality.run(parse(quality, *argv)) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object: the solver's banner went elsewhere
    assert [i["trace"] for i in report["instances"]] == ["fill", "churn"]
    for instance in report["instances"]:
        assert sum(instance["fleet"].values()) >= 8 and len(instance["fleet"]) == 3
        assert instance["node_names"] != sorted(
            f"{m}-{n}" for m, c in instance["fleet"].items() for n in range(c)
        )
        optimum, held = instance["optimum"], instance["non_migrating"]
        assert optimum["proven"] is True and held["proven"] is True
        # never moving a claim admits no more than moving them; a policy no more than either
        assert held["claims"] <= held["bound"] <= optimum["claims"]
        # the decision that lost the non-migrating optimum is named exactly when one did
        lost, admitted = instance["tangram_lost_at"], instance["policies"]["tangram"]["claims"]
        assert (lost is None) == (admitted == held["claims"])
        if lost is not None and "undecided" not in lost:
            assert lost["arrival"] <= admitted and lost["instead"] is not None
        for policy, figures in instance["policies"].items():
            assert figures["arrivals_before_first_failure"] <= held["claims"]
            assert figures["claims_ratio"] <= figures["claims_ratio_non_migrating"] <= 1.0
            assert figures["gpus_ratio"] >= 0.0
            if policy != "tangram":
                same = instance["stranded_at_same_claims"][policy]
                assert same["claims"] == min(figures["claims"], instance["policies"]["tangram"]["claims"])
                assert same["tangram"] >= 0.0 and same[policy] >= 0.0
    assert set(report["summary"]) == {"fill", "churn", "all"}
    assert set(report["summary"]["all"]["policies"]) == {"tangram", "first-fit", "best-fit"}
    assert set(report["summary"]["all"]["stranded_at_same_claims"]) == {"first-fit", "best-fit"}
    assert set(report["meets_targets"]) == {
        "fill_claims_ratio",
        "churn_claims_ratio",
        "above_first_fit",
        "fill_non_migrating_every_instance",
        "churn_non_migrating_every_instance",
        "fewer_stranded_than_first_fit",
        "fewer_stranded_than_best_fit",
    }


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
    # a node follows the decisions: every allocation, failure and release, the requests left out
    decided = events["ClaimAllocated"] + events["ClaimFailed"] + events["ClaimReleased"]
    assert report["node_follows_decisions"]["events"] == decided
    for figure in ("fold", "replay_and_fold", "bus_floor", "node_follows_decisions"):
        assert report[figure]["events_per_s"] > 0
    # the restart from an image taken at 90% of the claims log folds the tenth after it
    restart = report["from_image"]
    assert restart["state_matches_live"] is True
    claims_log = sum(
        events[kind] for kind in ("ClaimRequested", "ClaimAllocated", "ClaimFailed", "ClaimReleased")
    )
    after = restart["log_after_image"]
    assert after["claims"] == claims_log - int(claims_log * 0.9)
    assert 0 < after["node_results"] < events["PartitionApplied"]
    assert restart["events_folded"] == events["NodeInventory"] + after["claims"] + after["node_results"]
    assert restart["image_bytes"] > 0
    # the claims deleted an hour before the image are forgotten: its ledger holds fewer than one
    # that kept every claim, and the image is smaller
    assert restart["claims_remembered"] < restart["claims_remembered_keeping_every_claim"]
    assert restart["image_bytes"] < restart["image_bytes_keeping_every_claim"]
