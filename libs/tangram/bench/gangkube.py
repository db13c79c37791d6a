"""`tangram bench gangs --kubernetes`: the gang trace on the real control plane, kube-scheduler alone
and Tangram deciding, each on a fresh control plane with the same synthetic fleet.

The fleet is published as `tangram bench kubernetes --synthetic-nodes` publishes it (Node objects
and their ResourceSlices; for Tangram, the inventories on the bus and the allocator in its
Kubernetes mode): a pod counts as running once it is bound. The trace runs in real time, one
simulated minute every `seconds_per_minute` seconds: each job's pods are created at its arrival
(Tangram's with the scheduling gate admission adds, and the group's label and annotations), and
deleted once the job has run its duration after its last pod was bound. When nothing more departs
and no pod is bound for `settle_s`, the jobs still partly bound are deadlocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.bench.gangs import NAMESPACE, POD_GAP_MINUTES, Job, Outcome, settle_stuck
from tangram.bench.kubernetes.deciders import kube_scheduler_decider, tangram_decider
from tangram.bench.kubernetes.pods import RUN_LABEL, pod_manifest, template_manifest
from tangram.bench.kubernetes.syntheticnodes import deciding_allocator, publish_fleet, remove_fleet
from tangram.bench.kubesim import control_plane
from tangram.bench.traces import ClaimShape
from tangram.events import NodeHardware
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.gangs import GANG_LABEL, GANG_SIZE_ANNOTATION, NVLINK_DOMAIN_ANNOTATION
from tangram.local.controlplane import ControlPlane

POLL_S = 0.25
COMPONENTS_QPS = 1000


def _shape(job: Job) -> ClaimShape:
    return ClaimShape("gpu", job.gpus, nvlink=job.gpus > 1)


def _pod(job: Job, pod: int, namespace: str, *, gated: bool) -> dict[str, Any]:
    manifest = pod_manifest(f"{job.name}-{pod}", namespace, _shape(job), run=namespace, gated=gated)
    if job.grouped:
        manifest["metadata"]["labels"][GANG_LABEL] = job.name
        manifest["metadata"]["annotations"] = {
            GANG_SIZE_ANNOTATION: str(job.pods),
            NVLINK_DOMAIN_ANNOTATION: "true" if job.domain else "false",
        }
    return manifest


async def run_in_kubernetes(
    decider_name: str,
    hardware: list[NodeHardware],
    trace: list[Job],
    *,
    seconds_per_minute: float,
    settle_s: float,
) -> dict[str, Any]:
    """One decider's run of the trace on a fresh control plane; the same figures as the simulation's."""
    started = time.monotonic()
    async with control_plane(client_qps=COMPONENTS_QPS) as (plane, api):
        figures = await run_on(
            plane,
            api,
            decider_name,
            hardware,
            trace,
            seconds_per_minute=seconds_per_minute,
            settle_s=settle_s,
        )
    return {**figures, "wall_s": round(time.monotonic() - started, 1)}


async def run_on(
    plane: ControlPlane,
    api: Any,
    decider_name: str,
    hardware: list[NodeHardware],
    trace: list[Job],
    *,
    seconds_per_minute: float,
    settle_s: float,
) -> dict[str, Any]:
    """One decider's run of the trace on `plane`, in a namespace and on nodes of its own."""
    decider = tangram_decider(plane.kubeconfig) if decider_name == "tangram" else kube_scheduler_decider()
    namespace = f"{NAMESPACE}-{secrets.token_hex(3)}"
    core, resource = CoreV1Api(api), ResourceV1Api(api)
    await call("create namespace", core.create_namespace({"metadata": {"name": namespace}}))
    for shape in sorted({_shape(job) for job in trace}, key=lambda s: s.count):
        await call(
            f"create ResourceClaimTemplate {shape.label}",
            resource.create_namespaced_resource_claim_template(
                namespace, template_manifest(shape, namespace)
            ),
        )
    try:
        await publish_fleet(api, hardware, labels={RUN_LABEL: namespace})
        async with deciding_allocator(plane.kubeconfig, hardware, decider):
            run = _KubeRun(core, namespace, hardware, trace, gated=decider.gated)
            outcome = await run.drive(seconds_per_minute=seconds_per_minute, settle_s=settle_s)
    finally:
        await remove_fleet(api, [hw.node for hw in hardware])
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", core.delete_namespace(namespace))
    return {**outcome.report(), "seconds_per_minute": seconds_per_minute}


class _KubeRun:
    def __init__(
        self, core: CoreV1Api, namespace: str, hardware: list[NodeHardware], trace: list[Job], *, gated: bool
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.trace = trace
        self.gated = gated
        self.hardware = hardware
        self.rack_of = {hw.node: hw.gpus[0].clique_id for hw in hardware if hw.gpus and hw.gpus[0].clique_id}
        self.bound: dict[str, dict[int, tuple[str, float]]] = {}  # job -> pod -> (node, when, minutes)
        self.started: dict[str, float] = {}  # job -> when its last pod was bound (minutes)
        self.departed: set[str] = set()
        self.outcome = Outcome("kube-scheduler" if not gated else "tangram")

    async def drive(self, *, seconds_per_minute: float, settle_s: float) -> Outcome:
        loop = asyncio.get_running_loop()
        origin = loop.time()

        def minutes() -> float:
            return (loop.time() - origin) / seconds_per_minute

        pending = sorted(
            (
                (job.arrival + pod * POD_GAP_MINUTES, job, pod)
                for job in self.trace
                for pod in range(job.pods)
            ),
            key=lambda p: p[0],
        )
        by_name = {job.name: job for job in self.trace}
        for job in self.trace:
            if job.grouped:
                self.outcome.jobs += 1
            else:
                self.outcome.singles += 1
        last_change = loop.time()
        while True:
            now = minutes()
            while pending and pending[0][0] <= now:
                _, job, pod = pending.pop(0)
                self.bound.setdefault(job.name, {})
                manifest = _pod(job, pod, self.namespace, gated=self.gated)
                await call("create pod", self.core.create_namespaced_pod(self.namespace, manifest))
            if await self._observe(by_name, minutes()):
                last_change = loop.time()
            for name, at in list(self.started.items()):
                job = by_name[name]
                if name not in self.departed and minutes() >= at + job.duration:
                    self.departed.add(name)
                    last_change = loop.time()
                    for pod in range(job.pods):
                        with contextlib.suppress(KubeApiError):
                            await call(
                                "delete pod",
                                self.core.delete_namespaced_pod(
                                    f"{name}-{pod}", self.namespace, grace_period_seconds=0
                                ),
                            )
            running = [n for n in self.started if n not in self.departed]
            if not pending and not running and loop.time() - last_change > settle_s:
                break
            await asyncio.sleep(POLL_S)
        self._finish(by_name, minutes())
        return self.outcome

    async def _observe(self, by_name: dict[str, Job], now: float) -> bool:
        """Bindings since the last look; whether any pod was bound."""
        listed = await call("list pods", self.core.list_namespaced_pod(self.namespace))
        changed = False
        for pod in listed.items:
            name, _, number = pod.metadata.name.rpartition("-")
            job = by_name.get(name)
            if job is None or not pod.spec.node_name or name in self.departed:
                continue
            bound = self.bound.setdefault(name, {})
            if int(number) not in bound:
                bound[int(number)] = (pod.spec.node_name, now)
                changed = True
            if len(bound) == job.pods and name not in self.started:
                self.started[name] = now
                if job.grouped:
                    self.outcome.jobs_started += 1
                    self.outcome.waits.append(now - job.arrival)
                    cliques = {self.rack_of.get(node) for node, _ in bound.values()}
                    if job.domain and (len(cliques) != 1 or None in cliques):
                        self.outcome.domain_jobs_split += 1
                else:
                    self.outcome.singles_started += 1
        return changed

    def _finish(self, by_name: dict[str, Job], now: float) -> None:
        stuck = []
        for name, bound in self.bound.items():
            job = by_name[name]
            if not job.grouped:
                continue
            until = self.started.get(name, now)
            self.outcome.idle_gpu_minutes += sum((until - at) * job.gpus for _, at in bound.values())
            if bound and name not in self.started:
                stuck.append((job, len(bound)))
        settle_stuck(self.outcome, stuck, self.hardware)
