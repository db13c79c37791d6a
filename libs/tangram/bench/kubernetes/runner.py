"""One run of `tangram bench kubernetes` against a real control plane: the simulated nodes and
their kubelet stand-ins started, the trace driven pod by pod, each decision awaited and read back."""

from __future__ import annotations

import asyncio
import contextlib
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
    template_name,
)
from tangram.bench.kubernetes.report import PlacementTally, PodRecord, run_report
from tangram.bench.kubesim import BenchError, simulated_nodes, until
from tangram.bench.traces import Arrival, Op
from tangram.events.inventory import NodeHardware
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.api.watching import AbandoningWatch
from tangram.local.kubelet import NodeKubelet

DECISION_WAIT_S = 120.0  # a pod with no decision by then counts as not placed
SETTLE_S = 2.0  # an unplaceable pod is given this long to be placed after all (scheduler retries)
GONE_WAIT_S = 120.0
PREPARED_WAIT_S = 60.0


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
                    record.declared_unplaceable(condition.message or condition.reason, now)
        self.changed.set()

    async def watch(self, stop: asyncio.Event) -> None:
        """Follow the namespace's pods, listing again after a watch ends or breaks."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                listed = await call("list bench pods", self.core.list_namespaced_pod(self.namespace))
                for pod in listed.items:
                    self.observe(pod, loop.time())
                async with AbandoningWatch() as watch:
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
