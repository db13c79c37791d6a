"""`tangram bench kubernetes`: one workload of pods with claims, decided in a real Kubernetes.

Each decider gets a fresh control plane (etcd, kube-apiserver, kube-controller-manager and
kube-scheduler of the pinned release), the same simulated nodes (Tangram's services per node,
discovery publishing ResourceSlices) and a kubelet stand-in per node that prepares the claims of
the pods bound to it over the real DRA socket. The workload is the allocator benchmarks' seeded
trace (`tangram.bench.traces`): pods whose claims come from ResourceClaimTemplates (MIG 1g/2g/3g,
whole 1/2/4/8 GPUs, the multi-GPU ones in one NVLink domain), arriving and departing at half the
fleet's GPUs, then arriving only until they ask for `--saturation` times the fleet's GPUs.

Pods are driven one at a time: a pod is created and its decision awaited (bound to a node, or
found unplaceable), a departing pod is awaited until prepared, then deleted and awaited until its
claim is gone, so every decision sees the capacity the trace says is free. A pod that cannot be
placed is deleted and the trace goes on; the first one marks what the run admitted. The nodes
start from clean machines (no MIG instance). Deciders:

- `kube-scheduler`: kube-scheduler allocates the claims from the published slices;
- `tangram`: the allocator, started in its Kubernetes mode, decides the claims of pods that carry
  the scheduling gate (admission adds it in a cluster; here the pods are created with it), writes
  their `status.allocation` and lifts the gate; kube-scheduler then binds the pod to that node.

What each run reports is measured the same way for both: the allocations are read back from the
API server and laid on the nodes' hardware (`FleetState`) to count stranded GPUs and NVLink sets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api
from kubernetes_asyncio.watch import Watch

from tangram import DRIVER_NAME
from tangram.allocation import Allocated, FleetState, NvlinkTally
from tangram.bench.kubesim import BenchError, control_plane, simulated_nodes, until
from tangram.bench.prepare import percentiles
from tangram.bench.traces import (
    FLEET_MIX,
    Arrival,
    ClaimShape,
    Op,
    claim_spec,
    fleet_gpus,
    machine_hardware,
    saturating_trace,
)
from tangram.events.inventory import NodeHardware, renamed_machine
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlaneError
from tangram.local.kubelet import NodeKubelet

DECIDERS = ("kube-scheduler", "tangram")
MACHINES = ("hgx-h200", "h100-nvl-4x2")  # --nodes N cycles through these
CHURN_LOAD = 0.5  # share of the fleet's GPUs the pods alive ask for while the trace churns
# MIG 1g/2g/3g and whole 1/2/4/8 GPUs (multi-GPU ones on NVLink): the fleet mix without 4g.
KUBE_MIX: tuple[tuple[ClaimShape, float], ...] = tuple(
    (shape, weight) for shape, weight in FLEET_MIX if shape.kind == "gpu" or shape.compute <= 3
)
RUN_LABEL = "bench.tangram.dev/run"
MAX_NODES = 16  # each node is three service processes on this machine
MAX_PODS = 10_000
DECISION_WAIT_S = 120.0  # a pod with no decision by then counts as not placed
SETTLE_S = 2.0  # an unplaceable pod is given this long to be placed after all (scheduler retries)
GONE_WAIT_S = 120.0
PREPARED_WAIT_S = 60.0


# --- the workload (pure) -------------------------------------------------------------------------


def workload(seed: int, capacity_gpus: float, *, pods: int, saturation: float) -> list[Op]:
    """`pods` arrivals with departures at CHURN_LOAD of the fleet, then arrivals only until the
    pods alive ask for `saturation` times its GPUs: the same for a seed."""
    return saturating_trace(
        seed,
        capacity_gpus,
        churn_claims=pods,
        churn_load=CHURN_LOAD,
        saturation=saturation,
        mix=KUBE_MIX,
    )


def fleet(nodes: int, *, prefix: str = "") -> list[tuple[str, str]]:
    """(node name, machine) for `nodes` nodes, cycling through MACHINES."""
    return [(f"{prefix}{MACHINES[n % len(MACHINES)]}-{n}", MACHINES[n % len(MACHINES)]) for n in range(nodes)]


def node_hardware(nodes: list[tuple[str, str]]) -> list[NodeHardware]:
    """Each node's hardware as its simulated GPUs start: clean copies of the machines (no MIG
    instance, MIG mode off where it can be toggled without a reset), as `clean_machine` writes."""
    templates: dict[str, NodeHardware] = {}
    found = []
    for name, machine in nodes:
        if machine not in templates:
            templates[machine] = machine_hardware(machine)
        found.append(renamed_machine(templates[machine], name))
    return found


def template_name(shape: ClaimShape) -> str:
    return shape.label


def template_spec(shape: ClaimShape, driver: str = DRIVER_NAME) -> dict[str, Any]:
    """The claim spec of a shape (`claim_spec`), multi-GPU ones constrained to one NVLink domain
    as the shipped examples do: kube-scheduler reads the constraint, not the opaque config."""
    spec = claim_spec(shape, driver)
    if shape.nvlink:
        spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": f"{driver}/nvlinkDomain"}]
    return spec


def template_manifest(shape: ClaimShape, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(shape), "namespace": namespace},
        "spec": {"spec": template_spec(shape)},
    }


def pod_name(uid: str) -> str:
    return "pod-" + uid.removeprefix("claim-")


def pod_manifest(name: str, namespace: str, shape: ClaimShape, *, run: str, gated: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {RUN_LABEL: run},
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template_name(shape)}],
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpus"}]},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: run}},
        "spec": spec,
    }


# --- what a run saw, and what it reports (pure) --------------------------------------------------


@dataclass
class PodRecord:
    """One pod of the run; times are seconds on the run's monotonic clock."""

    name: str
    shape: ClaimShape
    created: float
    node: str | None = None
    scheduled: float | None = None  # first seen bound to a node
    prepared: float | None = None  # first seen Running: its claim prepared by the node
    unplaceable: str | None = None  # why the decider could not place it (last seen)
    unplaceable_at: float | None = None

    @property
    def decided(self) -> float | None:
        if self.scheduled is not None:
            return self.scheduled
        return self.unplaceable_at


class PlacementTally:
    """The allocations read back from the API server, laid on the nodes' hardware: stranded GPUs
    and, per multi-GPU claim, whether its GPUs are the best NVLink set (available, and ideal)."""

    def __init__(self, hardware: list[NodeHardware], driver: str = DRIVER_NAME) -> None:
        self.fleet = FleetState(driver=driver)
        for hw in hardware:
            self.fleet.apply_inventory(hw)
        self.nvlink = NvlinkTally()

    def placed(self, uid: str, node_name: str, devices: list[tuple[str, str]]) -> None:
        """A claim's devices, (request, device name) of the node's pool, as the decider chose them."""
        node = self.fleet.node(node_name)
        if node is not None:
            shape = node.shape
            chosen = [shape.devices[shape.index_by_name[d]] for _, d in devices if d in shape.index_by_name]
            gpus = {d.gpu_index for d in chosen if d.kind == "gpu"}
            if len(gpus) > 1:
                score = shape.pairs.set_score(gpus)
                offered = {index for index, free in node.whole_free.items() if free}
                best_available = max(score, shape.pairs.best_set_score(offered | gpus, len(gpus)))
                self.nvlink.count(
                    Allocated(
                        claim_uid=uid,
                        node=node_name,
                        devices=[],
                        set_score=score,
                        ideal_set_score=shape.best_set_score(len(gpus)),
                        best_available_set_score=best_available,
                    )
                )
        self.fleet.adopt_prepared(uid, node_name, devices)

    def released(self, uid: str) -> None:
        self.fleet.release(uid, destroy_mig=False)

    def stranded_gpus(self) -> float:
        return self.fleet.metrics().stranded_gpus


def _ms(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50_ms": None, "p99_ms": None}
    return dict(percentiles([s * 1000 for s in seconds]))


def run_report(
    records: list[PodRecord], *, stranded_gpus: float, nvlink: NvlinkTally, departures: int
) -> dict[str, Any]:
    """A run's figures from its pods in creation order. `stranded_gpus` is what the fleet had
    stranded when the first unplaceable pod came (at the end when none did); `nvlink` counts the
    multi-GPU claims of the whole run."""
    first = next((n for n, r in enumerate(records) if r.scheduled is None), None)
    admitted = records if first is None else records[:first]
    scheduled = [r for r in records if r.scheduled is not None]
    decided = [r for r in records if r.decided is not None]
    decision_s = sum(r.decided - r.created for r in decided if r.decided is not None)
    failed = records[first] if first is not None else None
    return {
        "pods_created": len(records),
        "pods_deleted": departures,  # departures of the trace (unplaceable pods are deleted too)
        "pods_scheduled": len(scheduled),
        "pods_unplaceable": len(records) - len(scheduled),
        "admitted_before_first_unplaceable": len(admitted),
        "first_unplaceable": None
        if failed is None
        else {"pod": failed.name, "claim": failed.shape.label, "reason": failed.unplaceable or ""},
        "admitted_gpus": round(sum(r.shape.gpus() for r in admitted), 3),
        "stranded_gpus": stranded_gpus,
        **nvlink.report(),
        "create_to_scheduled": _ms([r.scheduled - r.created for r in scheduled if r.scheduled is not None]),
        "create_to_prepared": _ms([r.prepared - r.created for r in scheduled if r.prepared is not None]),
        "prepared": sum(r.prepared is not None for r in scheduled),
        # scheduled pods never seen prepared (before their deletion, or by the end of the wait)
        "not_prepared": sum(r.prepared is None for r in scheduled),
        "decisions": len(decided),
        # One pod at a time: decisions over the time spent waiting for them.
        "decisions_per_s": round(len(decided) / decision_s, 2) if decision_s > 0 else None,
    }


RATIO_KEYS = (
    "admitted_before_first_unplaceable",
    "stranded_gpus",
    "multi_gpu_ideal_set_share",
    "multi_gpu_nvlink_optimal_share",
    "decisions_per_s",
)
LATENCY_KEYS = ("create_to_scheduled", "create_to_prepared")


def ratios(tangram: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, float | None]:
    """tangram / kube-scheduler per figure; None where the baseline is 0 or missing."""

    def ratio(a: Any, b: Any) -> float | None:
        if a is None or not b:
            return None
        return round(float(a) / float(b), 4)

    out = {key: ratio(tangram.get(key), baseline.get(key)) for key in RATIO_KEYS}
    for key in LATENCY_KEYS:
        for p in ("p50_ms", "p99_ms"):
            out[f"{key}_{p}"] = ratio(tangram[key][p], baseline[key][p])
    return out


# --- deciders ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decider:
    name: str
    allocator_args: tuple[str, ...] = ()  # how the allocator of the LocalCluster is started
    gated: bool = False  # pods carry Tangram's scheduling gate
    # Where the decider says a pod cannot be placed: the pod's PodScheduled condition
    # (kube-scheduler) or Warning Events on the pod or its claim (Tangram).
    failure_events: bool = False


def kube_scheduler_decider() -> Decider:
    return Decider(name="kube-scheduler")


# >>> The switch for Tangram deciding. It holds only what Tangram's side provides: the allocator's
# >>> `--kubernetes` mode (it writes status.allocation of gated pods' claims and lifts the gate) and
# >>> the scheduling gate admission adds. Everything else is the same run as kube-scheduler's.
def tangram_decider(kubeconfig: Path) -> Decider:
    return Decider(
        name="tangram",
        allocator_args=("--kubernetes", "--kubeconfig", str(kubeconfig)),
        gated=True,
        failure_events=True,
    )


def allocator_decides_in_kubernetes() -> bool:
    """Whether this allocator has its Kubernetes mode (`python -m services.allocator --kubernetes`)."""
    try:
        shown = subprocess.run(
            [sys.executable, "-m", "services.allocator", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--kubernetes" in shown.stdout


# --- one run against the real control plane ------------------------------------------------------


@dataclass
class _Run:
    api: Any
    namespace: str
    decider: Decider
    records: dict[str, PodRecord] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def core(self) -> Any:
        return CoreV1Api(self.api)

    @property
    def resource(self) -> Any:
        return ResourceV1Api(self.api)

    def observe(self, pod: Any, now: float) -> None:
        record = self.records.get(pod.metadata.name)
        if record is None:
            return
        if pod.spec.node_name and record.scheduled is None:
            record.scheduled, record.node = now, pod.spec.node_name
        if pod.status.phase == "Running" and record.prepared is None:
            record.prepared = now
        if not self.decider.failure_events and record.scheduled is None:
            for condition in pod.status.conditions or []:
                if (condition.type, condition.status, condition.reason) == (
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                ):
                    record.unplaceable = condition.message or condition.reason
                    record.unplaceable_at = record.unplaceable_at or now
        self.changed.set()

    async def watch(self, stop: asyncio.Event) -> None:
        """Follow the namespace's pods, listing again after a watch ends or breaks."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                listed = await call("list bench pods", self.core.list_namespaced_pod(self.namespace))
                for pod in listed.items:
                    self.observe(pod, loop.time())
                async with Watch() as watch:
                    stream = watch.stream(
                        self.core.list_namespaced_pod,
                        self.namespace,
                        resource_version=listed.metadata.resource_version,
                        timeout_seconds=60,
                    )
                    async for event in stream:
                        if event["type"] == "ERROR":
                            break
                        if event["type"] != "DELETED":
                            self.observe(event["object"], loop.time())
                        if stop.is_set():
                            break
            except Exception:  # a broken watch (expired version, dropped stream) is listed again
                await asyncio.sleep(0.5)

    async def warnings_about(self, record: PodRecord) -> str | None:
        """A Warning Event on the pod or its claim (how Tangram says a claim cannot be placed)."""
        names = {record.name}
        pod = await call("read bench pod", self.core.read_namespaced_pod(record.name, self.namespace))
        names |= {
            s.resource_claim_name for s in pod.status.resource_claim_statuses or [] if s.resource_claim_name
        }
        events = await call(
            "list bench events",
            self.core.list_namespaced_event(self.namespace, field_selector="type=Warning"),
        )
        for event in events.items:
            if event.involved_object.name in names and event.involved_object.kind in ("Pod", "ResourceClaim"):
                return f"{event.reason}: {event.message}"
        return None

    async def decision(self, record: PodRecord) -> None:
        """Wait until the pod is bound, or the decider says it cannot be placed and it stays so."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DECISION_WAIT_S
        polled = 0.0
        while record.scheduled is None:
            if record.unplaceable is not None:
                # Give the scheduler's retries a chance (a release it had not seen yet).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._scheduled(record), SETTLE_S)
                return
            if self.decider.failure_events and loop.time() - polled > 0.5:
                polled = loop.time()
                why = await self.warnings_about(record)
                if why is not None:
                    record.unplaceable, record.unplaceable_at = why, loop.time()
                    continue
            if loop.time() > deadline:
                record.unplaceable = f"no decision within {DECISION_WAIT_S:g} s"
                record.unplaceable_at = loop.time()
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.2)

    async def prepared(self, record: PodRecord, limit_s: float) -> bool:
        """Whether the pod is seen prepared (Running) within `limit_s`."""

        async def seen() -> None:
            while record.prepared is None:
                self.changed.clear()
                await self.changed.wait()

        try:
            await asyncio.wait_for(seen(), limit_s)
        except TimeoutError:
            return False
        return True

    async def _scheduled(self, record: PodRecord) -> None:
        while record.scheduled is None:
            self.changed.clear()
            await self.changed.wait()

    async def allocation(self, record: PodRecord) -> tuple[str, list[tuple[str, str]]]:
        """The pod's claim: its uid and the devices (request, device) of Tangram's driver."""
        pod = await call("read bench pod", self.core.read_namespaced_pod(record.name, self.namespace))
        [name] = [s.resource_claim_name for s in pod.status.resource_claim_statuses or [] if s.name == "gpus"]
        claim = await call_json(
            f"read ResourceClaim {name}",
            self.resource.read_namespaced_resource_claim(name, self.namespace, _preload_content=False),
        )
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        return claim["metadata"]["uid"], [
            (r["request"], r["device"]) for r in results if r.get("driver") == DRIVER_NAME
        ]

    async def delete(self, record: PodRecord, claim_uid: str | None) -> None:
        """Delete the pod; return once it and its claim are gone (the claim's devices free)."""
        await call("delete bench pod", self.core.delete_namespaced_pod(record.name, self.namespace))

        async def gone() -> bool:
            try:
                await call("read bench pod", self.core.read_namespaced_pod(record.name, self.namespace))
            except KubeApiError as error:
                if error.not_found:
                    claims = await call(
                        "list bench claims", self.resource.list_namespaced_resource_claim(self.namespace)
                    )
                    return all(
                        c.metadata.uid != claim_uid or c.status is None or c.status.allocation is None
                        for c in claims.items
                        if claim_uid is not None
                    )
                raise
            return False

        await until(f"pod {record.name} and its claim gone", gone, GONE_WAIT_S)


async def run_decider(
    api: Any,
    kubeconfig: Path,
    nodes: list[tuple[str, str]],
    ops: list[Op],
    decider: Decider,
    *,
    namespace: str,
    cleanup: bool = True,
) -> dict[str, Any]:
    """One run of the workload on `nodes` against the control plane `api` talks to.

    With `cleanup` false the namespace and its pods are left for inspection (the services and
    the kubelet stand-ins are stopped either way)."""
    core, resource = CoreV1Api(api), ResourceV1Api(api)
    names = [name for name, _ in nodes]
    await call("create namespace", core.create_namespace({"metadata": {"name": namespace}}))
    try:
        for shape in sorted({op.shape for op in ops if isinstance(op, Arrival)}, key=lambda s: s.label):
            await call(
                f"create ResourceClaimTemplate {template_name(shape)}",
                resource.create_namespaced_resource_claim_template(
                    namespace, template_manifest(shape, namespace)
                ),
            )
        async with simulated_nodes(
            api,
            kubeconfig,
            nodes,
            allocator_args=decider.allocator_args,
            labels={RUN_LABEL: namespace},
            cleanup=cleanup,
            benchmark="kubernetes",
        ) as cluster:
            run = _Run(api, namespace, decider)
            stop = asyncio.Event()
            kubelets = [NodeKubelet(api, node=name, dra_socket=cluster.dra_socket(name)) for name in names]
            tasks = [asyncio.create_task(k.run(stop)) for k in kubelets]
            watcher = asyncio.create_task(run.watch(stop))
            try:
                return await _drive(run, core, node_hardware(nodes), ops)
            finally:
                stop.set()
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        if cleanup:
            with contextlib.suppress(KubeApiError):
                await call("delete namespace", core.delete_namespace(namespace))


async def _drive(run: _Run, core: Any, hardware: list[NodeHardware], ops: list[Op]) -> dict[str, Any]:
    """The trace, pod by pod, on the running nodes; the run's report."""
    namespace, decider = run.namespace, run.decider
    tally = PlacementTally(hardware)
    loop = asyncio.get_running_loop()
    alive: dict[str, str] = {}  # pod name -> claim uid
    departures = 0
    stranded: float | None = None  # when the first pod cannot be placed
    for op in ops:
        name = pod_name(op.uid)
        if not isinstance(op, Arrival):
            if name in alive:
                # A pod runs before it ends: its claim prepared first (or given up on).
                await run.prepared(run.records[name], PREPARED_WAIT_S)
                await run.delete(run.records[name], alive[name])
                tally.released(alive.pop(name))
                departures += 1
            continue
        record = PodRecord(name=name, shape=op.shape, created=loop.time())
        run.records[name] = record
        manifest = pod_manifest(name, namespace, op.shape, run=namespace, gated=decider.gated)
        await call(f"create pod {name}", core.create_namespaced_pod(namespace, manifest))
        await run.decision(record)
        if record.scheduled is None or record.node is None:
            # Past saturation the trace goes on: the pod is taken away, so that it does not
            # take capacity later that the trace counts as free.
            if stranded is None:
                stranded = tally.stranded_gpus()
            await run.delete(record, None)
            continue
        uid, devices = await run.allocation(record)
        tally.placed(uid, record.node, devices)
        alive[name] = uid
    if stranded is None:
        stranded = tally.stranded_gpus()

    async def all_prepared() -> bool:
        return all(run.records[name].prepared is not None for name in alive)

    with contextlib.suppress(BenchError):
        await until("the admitted pods prepared", all_prepared, PREPARED_WAIT_S)
    records = list(run.records.values())
    return {
        "decider": decider.name,
        **run_report(records, stranded_gpus=stranded, nvlink=tally.nvlink, departures=departures),
        "pods": [
            {
                "pod": r.name,
                "claim": r.shape.label,
                "node": r.node,
                "scheduled": r.scheduled is not None,
                "prepared": r.prepared is not None,
            }
            for r in records
        ],
    }


# --- the command ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=int, default=2, help=f"simulated nodes, cycling {', '.join(MACHINES)}"
    )
    parser.add_argument(
        "--pods", type=int, default=100, help="pods that arrive while others depart (the churn)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--saturation",
        type=float,
        default=1.3,
        help="after the churn, pods arrive until they ask for this many times the fleet's GPUs",
    )
    parser.add_argument(
        "--deciders",
        default="kube-scheduler",
        help=f"comma-separated, run in this order: {', '.join(DECIDERS)} (default kube-scheduler)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def deciders_of(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in DECIDERS]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        raise BenchError(f"--deciders: a comma-separated list of {', '.join(DECIDERS)}, each once")
    return chosen


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    if (
        not 1 <= args.nodes <= MAX_NODES
        or not 0 <= args.pods <= MAX_PODS
        or not 0.1 <= args.saturation <= 3.0
    ):
        raise BenchError(f"--nodes in [1, {MAX_NODES}], --pods in [0, {MAX_PODS}], --saturation in [0.1, 3]")
    chosen = deciders_of(args.deciders)
    if "tangram" in chosen and not allocator_decides_in_kubernetes():
        raise BenchError(
            "--deciders tangram: this allocator has no Kubernetes mode (services.allocator --kubernetes) yet"
        )
    nodes = fleet(args.nodes)
    hardware = node_hardware(nodes)
    capacity = fleet_gpus(hardware)
    ops = workload(args.seed, capacity, pods=args.pods, saturation=args.saturation)
    runs: dict[str, Any] = {}
    for name in chosen:
        async with control_plane() as (plane, api):
            decider = tangram_decider(plane.kubeconfig) if name == "tangram" else kube_scheduler_decider()
            started = time.monotonic()
            runs[name] = await run_decider(
                api, plane.kubeconfig, nodes, ops, decider, namespace=f"bench-{secrets.token_hex(3)}"
            )
            runs[name]["run_s"] = round(time.monotonic() - started, 1)
    result: dict[str, Any] = {
        "benchmark": "kubernetes",
        "seed": args.seed,
        "nodes": dict(nodes),
        "gpus": capacity,
        "churn_pods": args.pods,
        "saturation": args.saturation,
        "trace_pods": sum(isinstance(op, Arrival) for op in ops),
        "trace_deletions": sum(not isinstance(op, Arrival) for op in ops),
        "runs": runs,
    }
    if "tangram" in runs and "kube-scheduler" in runs:
        result["tangram_over_kube_scheduler"] = ratios(runs["tangram"], runs["kube-scheduler"])
    return result


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def table(result: Mapping[str, Any]) -> str:
    """The report as a table: one row per figure, one column per decider (and the ratio)."""
    runs = result["runs"]
    deciders = list(runs)
    ratio = result.get("tangram_over_kube_scheduler")
    rows: list[tuple[str, list[Any], Any]] = []
    for key, label in (
        ("pods_created", "pods created"),
        ("pods_scheduled", "pods scheduled"),
        ("pods_unplaceable", "pods unplaceable"),
        ("pods_deleted", "pods deleted"),
        ("admitted_before_first_unplaceable", "admitted before first unplaceable"),
        ("admitted_gpus", "GPUs they asked for"),
        ("stranded_gpus", "stranded GPUs then"),
        ("multi_gpu_claims", "multi-GPU claims"),
        ("multi_gpu_ideal_set_share", "on an ideal NVLink set"),
        ("multi_gpu_nvlink_optimal_share", "on the best NVLink set available"),
        ("decisions_per_s", "decisions/s"),
        ("not_prepared", "scheduled, never prepared"),
    ):
        rows.append((label, [runs[d][key] for d in deciders], ratio.get(key) if ratio else None))
    for key, label in (
        ("create_to_scheduled", "create -> scheduled"),
        ("create_to_prepared", "create -> prepared"),
    ):
        for p in ("p50_ms", "p99_ms"):
            rows.append(
                (
                    f"{label} {p[:3]} ms",
                    [runs[d][key][p] for d in deciders],
                    ratio.get(f"{key}_{p}") if ratio else None,
                )
            )
    header = ["", *deciders, *(["tangram / kube-scheduler"] if ratio else [])]
    lines = [[label, *map(_cell, values), *([_cell(r)] if ratio else [])] for label, values, r in rows]
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header))]
    out = [
        f"tangram bench kubernetes: seed {result['seed']}, {result['gpus']} GPUs on "
        + ", ".join(f"{n} ({m})" for n, m in result["nodes"].items())
        + f", {result['trace_pods']} pods in the trace"
    ]
    for row in [header, *lines]:
        out.append(
            "  ".join(
                str(cell).ljust(widths[i]) if i == 0 else str(cell).rjust(widths[i])
                for i, cell in enumerate(row)
            )
        )
    for d in deciders:
        first = runs[d]["first_unplaceable"]
        if first is not None:
            out.append(f"{d}: first unplaceable {first['pod']} ({first['claim']}): {first['reason']}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    # The kubelet stand-ins log each prepare they retry; the report counts the pods never prepared.
    logging.getLogger("tangram.local.kubelet").setLevel(logging.ERROR)
    try:
        result = asyncio.run(bench(args))
    except (BenchError, ControlPlaneError, KubeApiError, OSError) as error:
        print(f"tangram bench kubernetes: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else table(result))
    return 0
