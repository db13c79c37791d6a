"""`tangram bench kubernetes`, its pure parts: the workload, the manifests, and the figures of a
run computed from hand-built pods and placements."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pytest

from services.allocator.settings import AllocatorSettings
from tangram import DRIVER_NAME
from tangram.bench import kubernetes as kb
from tangram.bench.kubesim import clean_machine
from tangram.bench.traces import Arrival, ClaimShape, Departure, alive_at_end, machine_hardware
from tangram.dra import node_devices
from tangram.events import MigPlacement, PartitionRequested
from tangram.kubernetes.objects.names import SCHEDULING_GATE

ONE = ClaimShape("gpu", 1)
PAIR = ClaimShape("gpu", 2, nvlink=True)
MIG_1G = ClaimShape("mig", compute=1, slices=1)


def test_the_workload_is_the_same_for_a_seed_and_differs_across_seeds() -> None:
    assert kb.workload(3, 16, pods=40, saturation=1.3) == kb.workload(3, 16, pods=40, saturation=1.3)
    assert kb.workload(3, 16, pods=40, saturation=1.3) != kb.workload(4, 16, pods=40, saturation=1.3)


def test_the_workload_churns_then_fills_past_saturation_with_the_kubernetes_mix() -> None:
    ops = kb.workload(5, 16, pods=40, saturation=1.3)
    arrivals = [op for op in ops if isinstance(op, Arrival)]
    assert len(arrivals) > 40  # the churn's 40, then the fill
    assert any(isinstance(op, Departure) for op in ops)
    assert not any(isinstance(op, Departure) for op in ops[ops.index(arrivals[40]) :])
    assert sum(shape.gpus() for shape in alive_at_end(ops).values()) >= 1.3 * 16
    shapes = {op.shape for op in arrivals}
    assert shapes <= {shape for shape, _ in kb.KUBE_MIX}
    assert all(s.kind == "gpu" or s.compute in (1, 2, 3) for s in shapes)
    assert all(s.nvlink for s in shapes if s.kind == "gpu" and s.count > 1)


def test_fleet_cycles_the_machines_under_distinct_names() -> None:
    assert kb.fleet(3, prefix="x-") == [
        ("x-hgx-h200-0", "hgx-h200"),
        ("x-h100-nvl-4x2-1", "h100-nvl-4x2"),
        ("x-hgx-h200-2", "hgx-h200"),
    ]


def test_multi_gpu_templates_ask_for_one_nvlink_domain_and_mig_ones_for_a_profile() -> None:
    pair = kb.template_manifest(PAIR, "ns")
    devices = pair["spec"]["spec"]["devices"]
    assert pair["metadata"] == {"name": "2gpu-nvlink", "namespace": "ns"}
    assert devices["requests"][0]["exactly"] == {"deviceClassName": "gpu.tangram.dev", "count": 2}
    assert devices["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "gpu.tangram.dev/nvlinkDomain"}
    ]
    mig = kb.template_spec(MIG_1G)["devices"]
    assert "constraints" not in mig
    assert mig["requests"][0]["exactly"]["deviceClassName"] == "mig.gpu.tangram.dev"
    assert 'startsWith("1g.")' in mig["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]


def test_pods_carry_the_scheduling_gate_only_when_tangram_decides() -> None:
    gated = kb.pod_manifest("pod-1-0", "ns", PAIR, run="r", gated=True)
    plain = kb.pod_manifest("pod-1-0", "ns", PAIR, run="r", gated=False)
    assert gated["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    assert "schedulingGates" not in plain["spec"]
    assert plain["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "2gpu-nvlink"}]
    assert plain["spec"]["nodeSelector"] == {kb.RUN_LABEL: "r"}


def test_a_run_reports_what_was_admitted_before_the_first_unplaceable_pod() -> None:
    records = [
        kb.PodRecord("a", ONE, created=0.0, node="n", scheduled=0.1, prepared=0.5),
        kb.PodRecord("b", MIG_1G, created=1.0, node="n", scheduled=1.3, prepared=2.0),
        kb.PodRecord("c", PAIR, created=2.0, unplaceable="no pair", unplaceable_at=2.2),
        kb.PodRecord("d", MIG_1G, created=3.0, node="n", scheduled=3.5),
        kb.PodRecord("e", PAIR, created=4.0, unplaceable="still no pair", unplaceable_at=4.2),
    ]
    nvlink = kb.NvlinkTally(multi_gpu=4, best_available=3, ideal=2)
    report = kb.run_report(records, stranded_gpus=1.5, nvlink=nvlink, departures=7)
    assert report["pods_created"] == 5
    assert report["pods_deleted"] == 7
    assert (report["pods_scheduled"], report["pods_unplaceable"]) == (3, 2)
    assert report["admitted_before_first_unplaceable"] == 2
    assert report["first_unplaceable"] == {"pod": "c", "claim": "2gpu-nvlink", "reason": "no pair"}
    assert report["admitted_gpus"] == 1.125  # a whole GPU and one of eight memory slices
    assert report["stranded_gpus"] == 1.5
    assert report["multi_gpu_claims"] == 4
    assert report["multi_gpu_nvlink_optimal_share"] == 0.75
    assert report["multi_gpu_ideal_set_share"] == 0.5
    # every scheduled pod: 100, 300 and 500 ms to be scheduled (p99 0.98 of the way from 300 to
    # 500); a and b prepared in 500 and 1000 (p99 0.99 of the way)
    assert report["create_to_scheduled"] == {"p50_ms": 300.0, "p99_ms": 496.0}
    assert report["create_to_prepared"] == {"p50_ms": 750.0, "p99_ms": 995.0}
    assert report["prepared"] == 2 and report["not_prepared"] == 1
    assert report["decisions"] == 5
    assert report["decisions_per_s"] == 3.85  # 5 decisions in 0.1 + 0.3 + 0.2 + 0.5 + 0.2 = 1.3 s


def test_a_run_without_an_unplaceable_pod_admits_them_all() -> None:
    records = [kb.PodRecord("a", ONE, created=0.0, node="n", scheduled=0.25)]
    report = kb.run_report(records, stranded_gpus=0.0, nvlink=kb.NvlinkTally(), departures=0)
    assert report["admitted_before_first_unplaceable"] == 1
    assert report["first_unplaceable"] is None
    assert report["create_to_prepared"] == {"p50_ms": None, "p99_ms": None}
    assert report["not_prepared"] == 1
    assert report["multi_gpu_ideal_set_share"] == 1.0  # no multi-GPU claim: nothing missed


def test_placements_read_back_count_nvlink_sets_and_stranded_gpus() -> None:
    tally = kb.PlacementTally(kb.node_hardware([("n", "h100-nvl-4x2")]))  # NVLink pairs 0-1, 2-3, ...
    tally.placed("bridged", "n", [("gpus", "gpu-0"), ("gpus", "gpu-1")])
    tally.placed("apart", "n", [("gpus", "gpu-2"), ("gpus", "gpu-4")])
    tally.placed("single", "n", [("gpus", "gpu-5")])
    assert (tally.nvlink.multi_gpu, tally.nvlink.ideal, tally.nvlink.best_available) == (2, 1, 1)
    assert tally.stranded_gpus() == 0.0
    tally.placed("slice", "n", [("gpus", "gpu-6-mig-1g-12gb-0")])
    assert tally.stranded_gpus() == 0.875  # seven of GPU 6's eight memory slices, no use whole
    tally.released("slice")
    assert tally.stranded_gpus() == 0.0
    # With the pairs 2-3 and 6-7 free, GPUs 3 and 7 (no NVLink between them) are neither the
    # ideal set nor the best one available.
    tally.released("apart")
    tally.placed("late", "n", [("gpus", "gpu-3"), ("gpus", "gpu-7")])
    assert (tally.nvlink.multi_gpu, tally.nvlink.ideal, tally.nvlink.best_available) == (3, 1, 1)


def test_ratios_divide_tangram_by_kube_scheduler() -> None:
    def run(admitted: int, stranded: float, rate: float | None, p50: float | None) -> dict[str, object]:
        return {
            "admitted_before_first_unplaceable": admitted,
            "stranded_gpus": stranded,
            "multi_gpu_ideal_set_share": 1.0,
            "multi_gpu_nvlink_optimal_share": 0.5,
            "decisions_per_s": rate,
            "create_to_scheduled": {"p50_ms": p50, "p99_ms": 10.0},
            "create_to_prepared": {"p50_ms": None, "p99_ms": 10.0},
        }

    out = kb.ratios(run(30, 1.0, 20.0, 50.0), run(20, 4.0, 10.0, 100.0))
    assert out["admitted_before_first_unplaceable"] == 1.5
    assert out["stranded_gpus"] == 0.25
    assert out["multi_gpu_ideal_set_share"] == 1.0
    assert out["decisions_per_s"] == 2.0
    assert out["create_to_scheduled_p50_ms"] == 0.5
    assert out["create_to_prepared_p50_ms"] is None
    assert kb.ratios(run(3, 1.0, None, 1.0), run(0, 0.0, 1.0, 1.0))["stranded_gpus"] is None


def test_deciders_are_named_once_each() -> None:
    assert kb.deciders_of("kube-scheduler, tangram") == ["kube-scheduler", "tangram"]
    for bad in ("", "kube-scheduler,kube-scheduler", "volcano"):
        with pytest.raises(kb.BenchError):
            kb.deciders_of(bad)


def test_the_switch_follows_the_allocators_kubernetes_mode() -> None:
    assert kb.allocator_decides_in_kubernetes() == ("kubernetes" in AllocatorSettings.model_fields)


def test_tangram_deciding_without_the_allocators_kubernetes_mode_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kb, "allocator_decides_in_kubernetes", lambda: False)
    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    assert kb.run(parser.parse_args(["--deciders", "kube-scheduler,tangram"])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Kubernetes mode" in err and "Traceback" not in err


def test_the_table_shows_each_decider_and_the_ratio() -> None:
    records = [kb.PodRecord("a", ONE, created=0.0, node="n", scheduled=0.1, prepared=0.2)]
    one = kb.run_report(records, stranded_gpus=0.0, nvlink=kb.NvlinkTally(), departures=0)
    result = {
        "seed": 1,
        "gpus": 8,
        "nodes": {"n": "hgx-h200"},
        "trace_pods": 1,
        "runs": {"kube-scheduler": one, "tangram": one},
        "tangram_over_kube_scheduler": kb.ratios(one, one),
    }
    text = kb.table(result)
    assert "kube-scheduler" in text and "tangram / kube-scheduler" in text
    assert "admitted before first unplaceable" in text and "create -> prepared p99 ms" in text


def test_the_nodes_start_from_the_clean_machines_the_tally_lays_allocations_on(tmp_path: Path) -> None:
    for machine in kb.MACHINES:
        simulated = machine_hardware(str(clean_machine(machine, tmp_path)), keep_instances=True)
        [tallied] = kb.node_hardware([("template", machine)])
        assert not any(gpu.mig_instances or gpu.mig_enabled for gpu in simulated.gpus)
        names = [d.name for d in node_devices(simulated, driver=DRIVER_NAME).devices]
        assert names == [d.name for d in node_devices(tallied, driver=DRIVER_NAME).devices]
        assert len(simulated.gpus) == 8


def test_scheduler_perf_fills_every_gpu_then_churns_at_half_full() -> None:
    phases = kb.scheduler_perf_phases(24, steady=5, seed=3)
    assert [(p.name, p.measured) for p in phases] == [("fill", True), ("half", False), ("steady", False)]
    fill, half, steady = (p.ops for p in phases)
    assert len(fill) == 24 and all(isinstance(op, Arrival) and op.shape == ONE for op in fill)
    assert len(half) == 12 and all(isinstance(op, Departure) for op in half)
    assert [type(op) for op in steady] == [Departure, Arrival] * 5
    # every deletion takes a pod that is there, and the cluster stays at half full
    alive: set[str] = set()
    for op in [*fill, *half, *steady]:
        if isinstance(op, Arrival):
            assert op.uid not in alive
            alive.add(op.uid)
        else:
            alive.remove(op.uid)
    assert len(alive) == 12
    # the steady phase deletes pods the cluster held before it, never one of its own
    steady_deleted = {op.uid for op in steady if isinstance(op, Departure)}
    assert steady_deleted <= {op.uid for op in fill} - {op.uid for op in half}
    assert kb.scheduler_perf_phases(24, steady=5, seed=3) == phases
    assert kb.scheduler_perf_phases(24, steady=5, seed=4) != phases


def test_synthetic_fleets_are_the_workloads_machines() -> None:
    assert kb.synthetic_fleet(2, "scheduler-perf", prefix="x-") == [
        ("x-l40s-8-0", "l40s-8"),
        ("x-l40s-8-1", "l40s-8"),
    ]
    assert [m for _, m in kb.synthetic_fleet(4, "mixed")] == [
        "hgx-h200",
        "h100-nvl-4x2",
        "l40s-8",
        "hgx-h200",
    ]


def test_synthetic_ratios_divide_tangram_by_kube_scheduler() -> None:
    def run(per_s: float, requests: float, p99: float | None) -> dict[str, object]:
        return {
            "pods_scheduled_per_s": per_s,
            "api_requests_per_pod": requests,
            "pods_scheduled": 10,
            "admitted_before_first_unplaceable": 10,
            "stranded_gpus": 0.0,
            "multi_gpu_ideal_set_share": None,
            "multi_gpu_nvlink_optimal_share": None,
            "measured_create_to_scheduled": {"p50_ms": 100.0, "p99_ms": p99},
        }

    out = kb.synthetic_ratios(run(60.0, 12.0, 400.0), run(40.0, 10.0, 800.0))
    assert out["pods_scheduled_per_s"] == 1.5 and out["api_requests_per_pod"] == 1.2
    assert out["create_to_scheduled_p50_ms"] == 1.0 and out["create_to_scheduled_p99_ms"] == 0.5
    assert out["stranded_gpus"] is None and out["multi_gpu_ideal_set_share"] is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workload", "scheduler-perf"], "--workload scheduler-perf runs on --synthetic-nodes"),
        (["--nodes", "17"], "--nodes in [1, 16]"),
        (["--synthetic-nodes", "--nodes", "1001"], "--nodes in [1, 1000]"),
        (["--synthetic-nodes", "--concurrency", "0"], "--concurrency in [1, 1000]"),
    ],
)
def test_bad_scale_flags_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    assert kb.run(parser.parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err


def test_both_deciders_run_unless_told_otherwise() -> None:
    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    assert kb.deciders_of(parser.parse_args([]).deciders) == ["kube-scheduler", "tangram"]


def test_a_synthetic_node_reports_each_partition_command_carried_out_at_once() -> None:
    placement = MigPlacement(start=4, size=2)
    create = PartitionRequested(
        key="n1",
        command_id="cmd-1",
        node="n1",
        action="create",
        gpu_uuid="GPU-1",
        gpu_index=3,
        profile="2g.35gb",
        profile_id=14,
        placement=placement,
        claim_uid="uid-1",
    )
    made = kb.instant_result(create)
    assert (made.command_id, made.node, made.claim_uid, made.action) == ("cmd-1", "n1", "uid-1", "create")
    assert (made.gpu_uuid, made.gpu_index, made.profile, made.placement) == ("GPU-1", 3, "2g.35gb", placement)
    assert made.mig_uuid.startswith("MIG-") and made.gpu_instance_id == 5 and made.compute_instance_id == 0
    assert made.event_id == "cmd-1-result" and made.subject == "tangram.node.n1.partition.applied"
    destroy = msgspec.structs.replace(create, command_id="cmd-2", action="destroy", mig_uuid=made.mig_uuid)
    gone = kb.instant_result(destroy)
    assert (gone.action, gone.mig_uuid, gone.gpu_instance_id, gone.compute_instance_id) == (
        "destroy",
        made.mig_uuid,
        -1,
        -1,
    )
