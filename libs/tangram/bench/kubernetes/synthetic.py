"""`tangram bench kubernetes --synthetic-nodes`: hundreds of nodes as kube-scheduler's own
scheduler_perf runs them, with no kubelet and no per-node process.

Each node is a Node object whose ResourceSlices Tangram's slice publisher writes (in the layout the
API server takes, as discovery would) and whose inventory is on the bus for the allocator (as
discovery would publish it). Nothing is prepared: a pod counts once it is bound to a node, and a
pod is deleted at once (no kubelet confirms a graceful end). Pods are created `concurrency` at a
time, or at `rate` pods per second, and their binding is followed by one watch, so the decider is
measured with pods arriving together rather than one at a time.

Workloads:

- `scheduler-perf`: l40s-8 nodes (8 whole GPUs, no MIG), one 1-GPU claim per pod from a
  template; pods are created until every GPU is taken (the measured phase, as
  `SchedulingWithResourceClaimTemplate` measures it), half of them are deleted, then a steady
  phase deletes one pod and creates one, `steady` times.
- `mixed`: hgx-h200, h100-nvl-4x2 and l40s-8 nodes with every MIG placement advertised; the seeded
  trace of the allocator benchmarks (MIG 1g/2g/3g and 1/2/4/8-GPU NVLink claims, churn at half the
  fleet's GPUs, then arrivals only past saturation), every operation of it measured.
- `sharing`: l40s-8 and h100-nvl-4x2 nodes with their share hosts; the trace of `tangram bench
  sharing` (shares of 2-24 GiB asked as `capacity.requests.memory`, some with a compute percentage,
  and exclusive 1-2 GPU claims; churn, then past saturation). kube-scheduler counts the shares by
  consumable capacity (1.36 and later); the compute percentages are Tangram's alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram import DRIVER_NAME
from tangram.bench.kubernetes.deciders import Decider
from tangram.bench.kubernetes.pods import (
    RUN_LABEL,
    node_hardware,
    pod_manifest,
    pod_name,
    template_manifest,
    workload,
)
from tangram.bench.kubernetes.report import PlacementTally, PodRecord, latency_ms, run_report
from tangram.bench.kubernetes.settling import (
    Idle,
    all_idle,
    allocator_idle,
    samples,
    scheduler_idle,
    settled,
    tangram_unschedulable,
    unschedulable,
)
from tangram.bench.kubernetes.syntheticnodes import (
    DecidingAllocator,
    deciding_allocator,
    publish_fleet,
    remove_fleet,
)
from tangram.bench.kubesim import BenchError, until
from tangram.bench.sharing import CHURN_LOAD as SHARING_CHURN_LOAD
from tangram.bench.sharing import SHARING_MIX
from tangram.bench.traces import Arrival, ClaimShape, Departure, Op, saturating_trace
from tangram.events import NodeHardware
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.api.watching import list_then_watch
from tangram.kubernetes.objects.claimbridge import UNSCHEDULABLE_REASON
from tangram.local.controlplane import ControlPlane

WORKLOADS = ("scheduler-perf", "mixed", "sharing")
SCHEDULER_PERF_MACHINES = ("l40s-8",)
MIXED_MACHINES = ("hgx-h200", "h100-nvl-4x2", "l40s-8")
SHARING_MACHINES = ("l40s-8", "h100-nvl-4x2")
MACHINES_OF = {
    "scheduler-perf": SCHEDULER_PERF_MACHINES,
    "mixed": MIXED_MACHINES,
    "sharing": SHARING_MACHINES,
}
ONE_GPU = ClaimShape("gpu", 1)
PHASE_LIMIT_S = 1800.0


def synthetic_fleet(nodes: int, workload_name: str, *, prefix: str = "syn-") -> list[tuple[str, str]]:
    """(node name, machine) for the workload's fleet, cycling through its machines."""
    machines = MACHINES_OF[workload_name]
    return [(f"{prefix}{machines[n % len(machines)]}-{n}", machines[n % len(machines)]) for n in range(nodes)]


@dataclass(frozen=True)
class Phase:
    name: str
    ops: list[Op]
    measured: bool  # its throughput and latencies are the run's figures


def scheduler_perf_phases(gpus: int, *, steady: int, seed: int) -> list[Phase]:
    """Fill every GPU with 1-GPU pods, delete half of them, then `steady` deletions and creations
    at half full. The pods of the fill go in an order the seed chooses, then those of the steady
    phase oldest first: a pod is deleted only once the pods the cluster held before it are gone,
    so none is deleted before it could be bound unless `steady` exceeds half the GPUs."""
    fill = [Arrival(f"claim-fill-{n}", ONE_GPU) for n in range(gpus)]
    chooser = random.Random(seed)  # noqa: S311 - a reproducible trace, not a secret
    order = [op.uid for op in fill]
    chooser.shuffle(order)
    alive = collections.deque(order)
    half: list[Op] = [Departure(alive.popleft()) for _ in range(gpus // 2)]
    churn: list[Op] = []
    for n in range(steady):
        churn.append(Departure(alive.popleft()))
        arrival = Arrival(f"claim-steady-{n}", ONE_GPU)
        churn.append(arrival)
        alive.append(arrival.uid)
    return [Phase("fill", list(fill), True), Phase("half", half, False), Phase("steady", churn, False)]


def mixed_phases(gpus: float, *, pods: int, saturation: float, seed: int) -> list[Phase]:
    return [Phase("trace", workload(seed, gpus, pods=pods, saturation=saturation), True)]


def sharing_phases(gpus: float, *, pods: int, saturation: float, seed: int) -> list[Phase]:
    ops = saturating_trace(
        seed, gpus, churn_claims=pods, churn_load=SHARING_CHURN_LOAD, saturation=saturation, mix=SHARING_MIX
    )
    return [Phase("trace", ops, True)]


# --- what is measured --------------------------------------------------------------------------


async def api_requests(api: Any) -> float:
    """Requests the API server has served (`apiserver_request_total`, every client together)."""
    response = await api.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False, _request_timeout=30
    )
    return sum(value for _, value in samples(await response.text(), "apiserver_request_total"))


@dataclass(frozen=True)
class ProcessUse:
    cpu_s: float
    peak_rss_mb: float


def process_use(pid: int) -> ProcessUse:
    """CPU seconds (user and system) and peak resident memory of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    cpu_s = ticks / os.sysconf("SC_CLK_TCK")
    peak_kb = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    return ProcessUse(cpu_s=cpu_s, peak_rss_mb=round(peak_kb / 1024, 1))


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class _Pods:
    """The run's pods, bound or not, as one watch of the namespace sees them."""

    records: dict[str, PodRecord] = field(default_factory=dict)
    # deleted by the workload before they were seen bound: whether they would have been placed is
    # not known, so they count neither as admitted nor as unplaceable
    deleted_unbound: set[str] = field(default_factory=set)

    async def on_change(self, kind: str, pod: dict[str, Any]) -> None:
        record = self.records.get(str(pod["metadata"].get("name")))
        if record is None or record.scheduled is not None:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            record.scheduled, record.node = time.monotonic(), str(node)
        elif (why := unschedulable(pod)) is not None:
            record.declared_unplaceable(why, time.monotonic())

    async def on_event(self, kind: str, event: dict[str, Any]) -> None:
        declared = tangram_unschedulable(event)
        record = None if declared is None else self.records.get(declared[0])
        if declared is not None and record is not None and record.scheduled is None:
            record.declared_unplaceable(declared[1], time.monotonic())


async def _drive(
    core: Any,
    namespace: str,
    ops: Sequence[Op],
    pods: _Pods,
    decider: Decider,
    *,
    concurrency: int,
    rate: float,
) -> list[str]:
    """Every operation of `ops`, `concurrency` requests in flight, no faster than `rate` ops/s (0:
    as fast as they go); the names of the pods created."""
    slots = asyncio.Semaphore(concurrency)
    created: list[str] = []
    running: set[asyncio.Task[None]] = set()
    failures: list[BaseException] = []
    started = time.monotonic()

    async def create(name: str, shape: ClaimShape) -> None:
        manifest = pod_manifest(name, namespace, shape, run=namespace, gated=decider.gated)
        await call(f"create pod {name}", core.create_namespaced_pod(namespace, manifest))

    async def delete(name: str) -> None:
        record = pods.records.get(name)
        if record is not None and record.scheduled is None:
            pods.deleted_unbound.add(name)
        with contextlib.suppress(KubeApiError):
            await call(
                f"delete pod {name}", core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            )

    def finished(task: asyncio.Task[None]) -> None:
        running.discard(task)
        slots.release()
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]

    for n, op in enumerate(ops):
        if rate > 0:
            wait = started + n / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        await slots.acquire()
        if failures:
            slots.release()
            break
        name = pod_name(op.uid)
        if isinstance(op, Arrival):
            pods.records[name] = PodRecord(name=name, shape=op.shape, created=time.monotonic())
            created.append(name)
            task = asyncio.create_task(create(name, op.shape))
        else:
            task = asyncio.create_task(delete(name))
        running.add(task)
        task.add_done_callback(finished)
    await asyncio.gather(*list(running), return_exceptions=True)
    if failures:
        raise BenchError(f"the workload stopped: {failures[0]}")
    return created


def _phase_figures(pods: _Pods, names: Sequence[str], started: float) -> dict[str, Any]:
    records = [pods.records[n] for n in names]
    bound = [r for r in records if r.scheduled is not None]
    last = max((r.scheduled for r in bound if r.scheduled is not None), default=None)
    span = (last - started) if last is not None else None
    return {
        "pods_created": len(records),
        "pods_scheduled": len(bound),
        "pods_scheduled_per_s": round(len(bound) / span, 2) if span else None,
        "create_to_scheduled": latency_ms(
            [r.scheduled - r.created for r in bound if r.scheduled is not None]
        ),
    }


async def run_synthetic(
    api: Any,
    plane: ControlPlane,
    nodes: list[tuple[str, str]],
    phases: Sequence[Phase],
    decider: Decider,
    *,
    namespace: str,
    concurrency: int,
    rate: float,
) -> dict[str, Any]:
    """One decider's run of `phases` on synthetic `nodes`; its report."""
    core, resource = CoreV1Api(api), ResourceV1Api(api)
    hardware = node_hardware(nodes)
    names = [name for name, _ in nodes]
    await call("create namespace", core.create_namespace({"metadata": {"name": namespace}}))
    shapes = {op.shape for phase in phases for op in phase.ops if isinstance(op, Arrival)}
    for shape in sorted(shapes, key=lambda s: s.label):
        await call(
            f"create ResourceClaimTemplate {shape.label}",
            resource.create_namespaced_resource_claim_template(
                namespace, template_manifest(shape, namespace)
            ),
        )
    try:
        layout = await publish_fleet(api, hardware, labels={RUN_LABEL: namespace})
        async with deciding_allocator(plane.kubeconfig, hardware, decider) as allocator:
            idle = [scheduler_idle(plane.endpoints.scheduler, plane.token, plane.scheduler_ca)]
            if allocator is not None:
                idle.append(allocator_idle(allocator.health_port))
            figures = await _measure(
                api,
                core,
                namespace,
                hardware=hardware,
                phases=phases,
                decider=decider,
                allocator=allocator,
                idle=all_idle(idle),
                concurrency=concurrency,
                rate=rate,
            )
            return figures | {"layout": layout}
    finally:
        await remove_fleet(api, names)
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", core.delete_namespace(namespace))


async def _measure(
    api: Any,
    core: Any,
    namespace: str,
    *,
    hardware: list[NodeHardware],
    phases: Sequence[Phase],
    decider: Decider,
    allocator: DecidingAllocator | None,
    idle: Idle,
    concurrency: int,
    rate: float,
) -> dict[str, Any]:
    pods = _Pods()
    stop = asyncio.Event()
    watchers = [
        asyncio.create_task(
            _follow(
                "bench pods", functools.partial(core.list_namespaced_pod, namespace), pods.on_change, stop
            )
        )
    ]
    if decider.failure_events:
        declared = functools.partial(
            core.list_namespaced_event, namespace, field_selector=f"reason={UNSCHEDULABLE_REASON}"
        )
        watchers.append(asyncio.create_task(_follow("bench events", declared, pods.on_event, stop)))
    allocator_pid = allocator.cluster.service("allocator").process.pid if allocator is not None else None
    try:
        requests_before = await api_requests(api)
        use_before = process_use(allocator_pid) if allocator_pid else None
        figures: dict[str, Any] = {}
        all_created: list[str] = []
        departures = 0
        for phase in phases:
            started = time.monotonic()
            created = await _drive(
                core, namespace, phase.ops, pods, decider, concurrency=concurrency, rate=rate
            )
            ended = await settled(pods.records, created, pods.deleted_unbound, idle, limit_s=PHASE_LIMIT_S)
            if not created:
                # deletions only: the next phase starts once their claims are gone (their devices
                # free), as scheduler_perf's steady state starts from a cluster really half full
                await _claims_gone(api, namespace, len(all_created) - departures - len(phase.ops))
            figures[phase.name] = _phase_figures(pods, created, started) | {
                "pods_deleted": sum(isinstance(op, Departure) for op in phase.ops),
                "seconds": round(time.monotonic() - started, 1),
                "ended": ended.how,
            }
            all_created += created
            departures += sum(isinstance(op, Departure) for op in phase.ops)
        requests = await api_requests(api) - requests_before
        use_after = process_use(allocator_pid) if allocator_pid else None
        tally = await _placements(api, namespace, hardware)
    finally:
        stop.set()
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
    records = [pods.records[n] for n in all_created if n not in pods.deleted_unbound]
    measured = next(figures[p.name] for p in phases if p.measured)
    report = run_report(
        records, stranded_gpus=tally.stranded_gpus(), nvlink=tally.nvlink, departures=departures
    )
    for unused in ("create_to_prepared", "prepared", "not_prepared", "decisions_per_s"):
        report.pop(unused, None)  # nothing is prepared, and pods are not decided one at a time
    return {
        "decider": decider.name,
        **report,
        "pods_deleted_before_bound": len(pods.deleted_unbound),
        "phases": figures,
        "pods_scheduled_per_s": measured["pods_scheduled_per_s"],
        "measured_create_to_scheduled": measured["create_to_scheduled"],
        "api_requests_per_pod": round(requests / max(1, len(records)), 2),
        "allocator_cpu_s_per_pod": None
        if use_before is None or use_after is None
        else round((use_after.cpu_s - use_before.cpu_s) / max(1, len(records)), 5),
        "allocator_peak_rss_mb": None if use_after is None else use_after.peak_rss_mb,
    }


async def _follow(
    what: str,
    list_call: Callable[..., Any],
    on_change: Callable[[str, dict[str, Any]], Awaitable[None]],
    stop: asyncio.Event,
) -> None:
    async def relist() -> str:
        listed = await call_json(what, list_call(_preload_content=False, _request_timeout=60))
        for item in listed.get("items") or []:
            await on_change("ADDED", item)
        return str(listed["metadata"].get("resourceVersion", ""))

    await list_then_watch(what, relist, list_call, on_change, stop, watch_timeout_s=300, request_timeout_s=60)


async def _claims_gone(api: Any, namespace: str, remaining: int) -> None:
    """Until the namespace holds no more than `remaining` claims."""
    resource = ResourceV1Api(api)

    async def gone() -> bool:
        listed = await call_json(
            "list bench claims",
            resource.list_namespaced_resource_claim(namespace, _preload_content=False, _request_timeout=60),
        )
        return len(listed.get("items") or []) <= remaining

    await until("the deleted pods' claims gone", gone, PHASE_LIMIT_S, every=0.2)


async def _placements(api: Any, namespace: str, hardware: list[NodeHardware]) -> PlacementTally:
    """The allocations of the claims still held, read back once and laid on the hardware."""
    tally = PlacementTally(hardware)
    listed = await call_json(
        "list bench claims",
        ResourceV1Api(api).list_namespaced_resource_claim(
            namespace, _preload_content=False, _request_timeout=60
        ),
    )
    for claim in listed.get("items") or []:
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        ours = [r for r in results if r.get("driver") == DRIVER_NAME]
        if ours:
            tally.placed(
                claim["metadata"]["uid"], ours[0]["pool"], [(r["request"], r["device"]) for r in ours]
            )
    return tally
