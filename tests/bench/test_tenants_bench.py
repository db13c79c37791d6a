"""`tangram bench tenants`: its objects and figures from hand-built records, and (against the real
control plane) a small run whose report is checked for what must hold."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from services.allocator.asking import MAX_IN_FLIGHT
from tangram import DRIVER_NAME
from tangram.allocation import Allocated, Claim, Failed, FleetState
from tangram.bench import tenants as tb
from tangram.bench.traces import machine_hardware, shipped_classes
from tangram.dra import node_devices
from tangram.events.inventory import renamed_machine
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane


def test_the_flood_asks_for_l40s_gpus_and_the_quiet_claims_for_an_h200_slice() -> None:
    fleet = FleetState(driver=DRIVER_NAME)
    for name, machine in tb.NODES:
        fleet.apply_inventory(renamed_machine(machine_hardware(machine), name))
    classes = shipped_classes()
    nodes = dict(tb.NODES)
    flood = [
        fleet.allocate(Claim(namespace="f", name=f"f{n}", uid=f"f{n}", spec=tb.flood_claim_spec()), classes)
        for n in range(9)
    ]
    assert all(isinstance(d, Allocated) and nodes[d.node] == "l40s-8" for d in flood[:8])
    assert isinstance(flood[8], Failed) and flood[8].cause == "capacity"
    quiet = [
        fleet.allocate(Claim(namespace="q", name=f"q{n}", uid=f"q{n}", spec=tb.quiet_claim_spec()), classes)
        for n in range(2 * tb.MAX_QUIET)
    ]
    assert all(isinstance(d, Allocated) and nodes[d.node] == "hgx-h200" for d in quiet)


def test_every_claim_has_a_gated_pod_using_it() -> None:
    claim = tb.claim_manifest("c", "ns", tb.flood_claim_spec())
    pod = tb.pod_manifest("c", "ns", "c")
    assert claim["metadata"] == {"name": "c", "namespace": "ns"} and claim["kind"] == "ResourceClaim"
    assert pod["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c"}]
    device = node_devices(machine_hardware("l40s-8"), driver=DRIVER_NAME).devices[0]
    expression = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert device.attributes[f"{DRIVER_NAME}/productName"] in expression


def _tally(decisions: list[tuple[str, str, float]], created: int) -> tb.FloodTally:
    tally = tb.FloodTally(created=created)
    for uid, outcome, when in decisions:
        tally.decided(uid, outcome, when)
    return tally


def test_the_flood_tally_counts_decisions_between_two_moments_and_its_backlog() -> None:
    tally = _tally(
        [("a", "allocated", 1.0), ("b", "failed", 2.0), ("b", "failed", 3.0), ("c", "failed", 4.0)], 5
    )
    assert tally.backlog == 2  # five created, a b c decided
    assert tally.decisions_between(1.0, 3.0) == 2  # after 1.0, up to 3.0: b twice
    assert tally.decisions_between(0.0, 10.0) == 4
    assert tally.claims_decided_by(2.5) == 2
    assert tally.last_outcome == {"a": "allocated", "b": "failed", "c": "failed"}


def test_latency_is_p50_p99_and_max_of_the_allocated_claims() -> None:
    records = [tb.QuietRecord(f"q{n}", created=float(n), allocated=n + 0.001 * (n + 1)) for n in range(4)]
    records.append(tb.QuietRecord("never", created=9.0))
    # 1, 2, 3 and 4 ms: p99 lies 0.97 of the way from 3 to 4
    assert tb.latency(records) == {"p50_ms": 2.5, "p99_ms": 3.97, "max_ms": 4.0}
    assert tb.latency([tb.QuietRecord("never", created=0.0)]) == {
        "p50_ms": None,
        "p99_ms": None,
        "max_ms": None,
    }


def test_the_flood_report_places_the_quiet_claims_in_the_flood() -> None:
    # The flood starts at 0, is created at 1; quiet claims at 1-1.5 and 2-2.5; flood decisions every
    # 0.25 s from 0.25 to 5 (20 claims, one decided twice), the first allocated.
    decisions = [(f"f{n}", "allocated" if n == 0 else "failed", 0.25 * (n + 1)) for n in range(20)]
    decisions.append(("f3", "failed", 5.0))
    tally = _tally(sorted(decisions, key=lambda d: d[2]), 20)
    records = [
        tb.QuietRecord("q0", created=1.0, flood_backlog=16, allocated=1.5),
        tb.QuietRecord("q1", created=2.0, flood_backlog=12, allocated=2.5),
    ]
    report = tb.flood_report(
        records, tally, flood_claims=20, started=0.0, created_at=1.0, ended=6.0, loadavg=(1.0, 2.0, 3.0)
    )
    assert report["quiet_allocated"] == report["quiet_claims"] == 2
    assert report["quiet_latency"] == {"p50_ms": 500.0, "p99_ms": 500.0, "max_ms": 500.0}
    assert report["flood_create_s"] == 1.0 and report["phase_s"] == 6.0
    assert report["flood_backlog_at_quiet_start"] == 16
    assert report["flood_backlog_per_quiet_claim"] == [16, 12]
    assert report["flood_decisions_while_quiet_waited"] == {"max": 2, "mean": 2.0}  # 1.25 1.5, 2.25 2.5
    assert report["flood_decisions_during_quiet"] == 6  # 1.25 ... 2.5
    assert report["flood_claims_decided_when_quiet_done"] == 10
    assert report["flood_decisions"] == 21 and report["flood_claims_decided"] == 20
    assert (report["flood_allocated"], report["flood_failed"]) == (1, 19)
    assert report["flood_decisions_per_s"] == 4.21  # 20 intervals over 4.75 s
    assert report["quiet_done_s"] == 2.5 and report["flood_drained_s"] == 5.0
    assert report["loadavg"] == [1.0, 2.0, 3.0]
    undrained = tb.flood_report(
        records, tally, flood_claims=21, started=0.0, created_at=1.0, ended=6.0, loadavg=(0.0, 0.0, 0.0)
    )
    assert undrained["flood_drained_s"] is None


def test_ratios_divide_the_flood_phase_by_the_alone_phase() -> None:
    def phase(p50: float | None, p99: float | None, top: float | None) -> dict[str, Any]:
        return {"quiet_latency": {"p50_ms": p50, "p99_ms": p99, "max_ms": top}}

    assert tb.ratios(phase(30.0, 90.0, None), phase(10.0, 0.0, 5.0)) == {
        "p50_ms": 3.0,
        "p99_ms": None,
        "max_ms": None,
    }


def test_sizes_out_of_range_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    tb.add_arguments(parser)
    assert tb.run(parser.parse_args(["--quiet", str(tb.MAX_QUIET + 1)])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--quiet in [1, 28]" in err


@pytest.mark.controlplane
@pytest.mark.timeout(600)
async def test_a_small_flood_does_not_hold_up_the_quiet_namespace(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    flood, quiet = 200, 3
    report = await tb.run_tenants(
        kube, controlplane.kubeconfig, flood=flood, quiet=quiet, prefix=f"tn{unique.rsplit('-', 1)[-1]}-"
    )
    alone, under = report["alone"], report["under_flood"]
    # Every quiet claim allocated, in both phases.
    assert alone["quiet_allocated"] == under["quiet_allocated"] == quiet
    assert len(report["quiet_claims"]) == 2 * quiet
    assert all(row["latency_ms"] is not None and row["latency_ms"] > 0 for row in report["quiet_claims"])
    for phase in (alone, under):
        figures = phase["quiet_latency"]
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
        assert len(phase["loadavg"]) == 3
    ratio = report["under_flood_over_alone"]
    assert ratio["p50_ms"] == round(under["quiet_latency"]["p50_ms"] / alone["quiet_latency"]["p50_ms"], 3)
    # The flood: every claim decided once (nothing was released), eight allocated on the L40S node.
    assert under["flood_claims"] == flood
    assert under["flood_claims_decided"] == under["flood_decisions"] == flood
    assert (under["flood_allocated"], under["flood_failed"]) == (8, flood - 8)
    assert under["flood_drained_s"] is not None and under["flood_create_s"] > 0
    # Fairness: the quiet claims came while the flood waited, and none of them waited for it: each
    # was decided with flood claims still waiting, after at most the claims already asked.
    backlog = under["flood_backlog_at_quiet_start"]
    assert backlog > MAX_IN_FLIGHT
    assert under["flood_claims_decided_when_quiet_done"] < flood
    assert under["quiet_done_s"] < under["flood_drained_s"]
    assert under["flood_decisions_while_quiet_waited"]["max"] < backlog
