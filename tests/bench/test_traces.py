"""Traces and fleets for the allocator benchmarks: deterministic, well-formed, clean copies."""

from __future__ import annotations

from tangram.bench.quality import _alive_after
from tangram.bench.traces import (
    Arrival,
    ClaimShape,
    Departure,
    Op,
    alive_at_end,
    build_fleet,
    churn_trace,
    claim_spec,
    saturating_trace,
)


def test_churn_trace_is_the_same_for_a_seed_and_differs_across_seeds() -> None:
    assert churn_trace(7, 200, 30.0) == churn_trace(7, 200, 30.0)
    assert churn_trace(7, 200, 30.0) != churn_trace(8, 200, 30.0)


def test_churn_trace_departs_only_claims_that_arrived_before() -> None:
    ops = churn_trace(3, 300, 20.0)
    arrived: set[str] = set()
    departed: set[str] = set()
    for op in ops:
        if isinstance(op, Arrival):
            arrived.add(op.uid)
        else:
            assert op.uid in arrived and op.uid not in departed
            departed.add(op.uid)
    assert len(arrived) == 300
    assert 0 < len(departed) < 300


def test_alive_at_end_drops_departed_claims() -> None:
    one, two = ClaimShape("gpu", 1), ClaimShape("mig", compute=1, slices=1)
    ops: list[Op] = [Arrival("a", one), Arrival("b", two), Departure("a"), Arrival("c", one)]
    assert alive_at_end(ops) == {"b": two, "c": one}


def test_saturating_trace_stops_once_the_claims_alive_ask_for_the_fleet() -> None:
    ops = saturating_trace(5, 16.0, churn_claims=40)
    alive = alive_at_end(ops)
    demand = sum(shape.gpus() for shape in alive.values())
    last = ops[-1]
    assert isinstance(last, Arrival)
    assert demand >= 16.0
    assert demand - last.shape.gpus() < 16.0


def test_mig_claim_spec_selects_profile_by_compute_and_slices() -> None:
    spec = claim_spec(ClaimShape("mig", compute=3, slices=4))
    exactly = spec["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.gpu.tangram.dev"
    expression = exactly["selectors"][0]["cel"]["expression"]
    assert 'profile.startsWith("3g.")' in expression
    assert "placementSize == 4" in expression
    assert "config" not in spec["devices"]


def test_nvlink_claim_spec_carries_the_topology_config() -> None:
    spec = claim_spec(ClaimShape("gpu", 4, nvlink=True))
    assert spec["devices"]["requests"][0]["exactly"] == {"deviceClassName": "gpu.tangram.dev", "count": 4}
    parameters = spec["devices"]["config"][0]["opaque"]["parameters"]
    assert parameters["kind"] == "TopologyConfig"
    assert parameters["interconnect"] == "NVLink"


def test_fleet_nodes_have_own_names_and_uuids_and_no_mig_instances() -> None:
    nodes = build_fleet([("hgx-h200", 3), ("l40s-8", 1)])
    assert [hw.node for hw in nodes] == ["hgx-h200-0", "hgx-h200-1", "hgx-h200-2", "l40s-8-0"]
    uuids = [g.uuid for hw in nodes for g in hw.gpus]
    assert len(uuids) == 32 == len(set(uuids))
    h200 = nodes[0].gpus[0]
    assert h200.mig_instances == [] and not h200.mig_enabled  # shipped with a 3g and a 1g instance


def test_fleet_keeps_instances_when_asked() -> None:
    (hw,) = build_fleet([("hgx-h200", 1)], keep_instances=True)
    assert sorted(m.profile for m in hw.gpus[0].mig_instances) == ["1g.18gb", "3g.71gb"]


def test_the_claims_an_arrival_meets_include_those_that_depart_after_it() -> None:
    """The optimum is checked against the claims alive when a claim arrives: a departure listed
    after that arrival has not happened yet (it was counted early, which understated the load)."""
    one, two = ClaimShape("gpu", 1), ClaimShape("gpu", 2)
    ops: list[Op] = [Arrival("a", one), Arrival("b", two), Departure("a"), Arrival("c", one)]
    assert _alive_after(ops, 0) == []
    assert _alive_after(ops, 2) == [one, two]
    assert _alive_after(ops, 3) == [two, one]
