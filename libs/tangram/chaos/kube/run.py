"""A chaos run on Kubernetes: the real control plane, the admission webhook, a leader and a standby
allocator deciding in Kubernetes, simulated nodes with their services and kubelet stand-ins; pods
with Tangram claims (MIG and whole GPUs, NVLink pairs, three priorities) created and deleted while
a seeded scheduler kills what a cluster loses; then the invariants, read from the API server, the
nodes and the log.

The run: start everything, drive `pods` pods (`concurrency` alive at once) while the faults come,
stop the faults and bring back what is down, make `keep_at_end` pods that must each be Running or
waiting with an Event saying why within `settle_s`, check, delete every pod and check that nothing
is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api, SchedulingV1Api

from tangram.allocation import FleetState
from tangram.allocation.model import Allocated, Claim
from tangram.bus import Bus, BusConfig
from tangram.chaos.checks import device_classes, get_json
from tangram.chaos.kube.config import KubeChaosConfig
from tangram.chaos.kube.faults import KUBE_FAULT_KINDS, KubeFaultKind, kube_fault_order
from tangram.chaos.kube.invariants import (
    allocated_by_uid,
    devices_held_twice,
    mig_devices_by_node,
    mig_instances_differ,
    reserved_nodes_taken,
)
from tangram.chaos.kube.pods import (
    NAMESPACE,
    PRIORITIES,
    SHAPES,
    claim,
    claim_template,
    create_pod,
    delete_pod,
    pick,
    pod,
    priority_class,
    read_pod,
    retrying,
)
from tangram.chaos.nodes import NodeView
from tangram.chaos.workload import HEAL_TIMEOUT_S
from tangram.events import CLAIMS_STREAM, INVENTORY_STREAM, NodeInventory
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.objects.claimbridge import UNSCHEDULABLE_REASON, allocation_of, gated
from tangram.kubernetes.objects.preempting import PREEMPTED_REASON
from tangram.local import admission
from tangram.local.clusterup import NAMESPACE as TANGRAM_NAMESPACE
from tangram.local.clusterup import WEBHOOK_TOKEN_S, helm_binary, install_device_classes, until_deciding
from tangram.local.controlplane import ControlPlane, register_node
from tangram.local.kubelet import NodeKubelet
from tangram.local.processes import LocalCluster, leading_allocator, logged_health_port

RUNNING_WITHIN_S = 45.0  # a pod not running by then is deleted as it waits (its reason recorded)
IN_FLIGHT_DELETE_S = 0.4  # a pod deleted in flight goes within this long of its creation
QUIET_WITHIN_S = 60.0  # for the nodes' MIG instances to match the allocations once pods are settled


class KubeChaosRun:
    def __init__(self, cluster: LocalCluster, plane: ControlPlane, config: KubeChaosConfig) -> None:
        self.cluster = cluster
        self.plane = plane
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - a reproducible run, not a secret
        self.nodes = NodeView(cluster, config.nodes)
        self.faults: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.problems: dict[str, list[str]] = {}
        self.begun = 0
        self.creates_refused = 0  # pod creates the API server refused because admission was down
        self.ending = asyncio.Event()
        self.every_kind_made = asyncio.Event()
        self.hook: admission.LocalWebhook | None = None
        self.webhook: admission.WebhookProcess | None = None
        self._sequence = 0
        self._side: set[asyncio.Task[None]] = set()

    def problem(self, kind: str, line: str) -> None:
        self.problems.setdefault(kind, []).append(line)

    def _next_name(self, prefix: str) -> str:
        self._sequence += 1
        return f"{prefix}-{self._sequence}"

    # --- setup ------------------------------------------------------------------------------------

    async def setup(self, api: Any) -> None:
        for node in self.config.nodes:
            await register_node(api, node.name)
        await install_device_classes(api)
        core = CoreV1Api(api)
        for namespace in (TANGRAM_NAMESPACE, NAMESPACE):
            await call(
                f"create Namespace {namespace}", core.create_namespace({"metadata": {"name": namespace}})
            )
        for name, value in PRIORITIES:
            await call(
                f"create PriorityClass {name}",
                SchedulingV1Api(api).create_priority_class(priority_class(name, value)),
            )
        for shape in SHAPES:
            await call(
                f"create ResourceClaimTemplate {shape}",
                ResourceV1Api(api).create_namespaced_resource_claim_template(
                    NAMESPACE, claim_template(shape)
                ),
            )
        self.cluster.kubeconfig = self.plane.kubeconfig
        self.cluster.decide_in_kubernetes = True
        self.cluster.allocators = 2
        self.cluster.allocator_args = ("--kubernetes-namespace", TANGRAM_NAMESPACE)
        self.cluster.start()
        self.hook = await admission.install(
            self.plane,
            api,
            namespace=TANGRAM_NAMESPACE,
            kubeconfig=self.cluster.workdir / "admission" / "kubeconfig",
            log=self.cluster.workdir / "logs" / "admission.log",
            kube_version=f"{self.plane.release.minor}.0",
            token_s=WEBHOOK_TOKEN_S,
            binary=await asyncio.to_thread(helm_binary, lambda _: None),
        )
        await self._start_webhook()
        await until_deciding(api)

    async def _start_webhook(self) -> None:
        assert self.hook is not None
        self.webhook = self.hook.start("--log-level=info")
        await admission.wait_ready(self.webhook, 120.0)

    # --- the pods ---------------------------------------------------------------------------------

    async def worker(self, api: Any) -> None:
        while not self.ending.is_set() and self.begun < self.config.pods:
            self.begun += 1
            shape, priority = pick(self.rng)
            name = self._next_name("p")
            hold_s = self.rng.uniform(0.5, 3.0)
            await self._live_pod(api, name, shape, priority, hold_s)

    async def _live_pod(self, api: Any, name: str, shape: str, priority: str, hold_s: float) -> None:
        core = CoreV1Api(api)
        self.creates_refused += await create_pod(core, pod(name, priority, template=shape))
        state = await self._until_running(core, name, RUNNING_WITHIN_S)
        if state == "Running":
            self.outcomes["ran"] += 1
            await asyncio.sleep(hold_s)
        elif state == "gone":
            self.outcomes["preempted" if await self._told(core, name, PREEMPTED_REASON) else "gone"] += 1
            return
        else:
            told = await self._told(core, name, UNSCHEDULABLE_REASON)
            self.outcomes["waited_then_deleted" if told else "waited_untold_then_deleted"] += 1
        await delete_pod(core, name)

    async def _until_running(self, core: CoreV1Api, name: str, within_s: float) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while loop.time() < deadline:
            try:
                found = await read_pod(core, name)
            except KubeApiError as error:
                if error.not_found:
                    return "gone"
                raise
            if (found.get("status") or {}).get("phase") == "Running":
                return "Running"
            await asyncio.sleep(0.3)
        return "waiting"

    async def _told(self, core: CoreV1Api, pod_name: str, reason: str) -> bool:
        events = await retrying(
            lambda: call_json("list Events", core.list_namespaced_event(NAMESPACE, _preload_content=False))
        )
        return any(
            e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == pod_name
            for e in events.get("items") or []
        )

    # --- the faults -------------------------------------------------------------------------------

    async def fault_loop(self, api: Any) -> None:
        order = kube_fault_order(self.rng)
        owed: list[KubeFaultKind] = []  # kinds that could not be made when their turn came
        while not self.ending.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.ending.wait(), self.rng.expovariate(1 / self.config.fault_interval_s)
                )
            if self.ending.is_set():
                break
            # a fault that could not be made (no allocator leads while the lease changes hands) is
            # owed and tried first at each later tick, while the other kinds go on in their order,
            # so that a short run still makes every kind
            if owed and await self._inject(api, owed[0]):
                self.faults[owed.pop(0)] += 1
            else:
                kind = next(order)
                if await self._inject(api, kind):
                    self.faults[kind] += 1
                elif kind not in owed:
                    owed.append(kind)
            if all(self.faults[k] >= 1 for k in KUBE_FAULT_KINDS):
                self.every_kind_made.set()

    async def _inject(self, api: Any, kind: KubeFaultKind) -> bool:
        if kind in ("kill-leader-allocator", "kill-standby-allocator"):
            leader = leading_allocator(self.cluster)
            names = [p.name for p in self.cluster.processes if p.name.startswith("allocator")]
            target = (
                leader if kind == "kill-leader-allocator" else next((n for n in names if n != leader), None)
            )
            if target is None or leader is None:
                return False
            await self._crash_and_restart(target)
        elif kind == "kill-node-service":
            node = self.rng.choice(self.config.nodes).name
            service = self.rng.choice(["discovery", "partitioner", "cdi"])
            await self._crash_and_restart(f"{service}@{node}")
        elif kind == "kill-webhook":
            assert self.webhook is not None
            self.webhook.process.kill()
            self.webhook.process.wait()
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            await self._start_webhook()
        elif kind == "restart-apiserver":
            await asyncio.to_thread(self.plane.crash_and_restart)
        elif kind == "delete-pod-in-flight":
            self._aside(self._deleted_in_flight(api))
        else:
            self._aside(self._claim_deleted_while_allocated(api))
        return True

    async def _crash_and_restart(self, name: str) -> None:
        self.cluster.crash(name)
        await asyncio.sleep(self.rng.uniform(0.3, 2.0))
        self.cluster.restart(name)

    def _aside(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _deleted_in_flight(self, api: Any) -> None:
        core = CoreV1Api(api)
        shape, priority = pick(self.rng)
        name = self._next_name("inflight")
        self.creates_refused += await create_pod(core, pod(name, priority, template=shape))
        await asyncio.sleep(self.rng.uniform(0.0, IN_FLIGHT_DELETE_S))
        await delete_pod(core, name)
        self.outcomes["deleted_in_flight"] += 1

    async def _claim_deleted_while_allocated(self, api: Any) -> None:
        core, resource = CoreV1Api(api), ResourceV1Api(api)
        name = self._next_name("own")
        await retrying(
            lambda: call(
                f"create ResourceClaim {name}",
                resource.create_namespaced_resource_claim(NAMESPACE, claim(name, "whole-1")),
            )
        )
        self.creates_refused += await create_pod(core, pod(name, "chaos-mid", claim_name=name))
        running = await self._until_running(core, name, RUNNING_WITHIN_S) == "Running"
        await retrying(
            lambda: call(
                f"delete ResourceClaim {name}", resource.delete_namespaced_resource_claim(name, NAMESPACE)
            )
        )
        if running:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))  # the claim is being deleted, its pod runs on
        await delete_pod(core, name)
        self.outcomes["claim_deleted_while_allocated" if running else "claim_deleted_while_waiting"] += 1

    # --- sampling and healing ---------------------------------------------------------------------

    async def sampler(self, api: Any, stop: asyncio.Event) -> None:
        """Every second, one listing of the claims: no device in two claims' allocations."""
        resource = ResourceV1Api(api)
        while not stop.is_set():
            with contextlib.suppress(KubeApiError):
                listed = await call_json(
                    "list ResourceClaims",
                    resource.list_namespaced_resource_claim(NAMESPACE, _preload_content=False),
                )
                pods = await call_json(
                    "list Pods", CoreV1Api(api).list_namespaced_pod(NAMESPACE, _preload_content=False)
                )
                uids = {str(p["metadata"]["uid"]) for p in pods.get("items") or []}
                for line in devices_held_twice(listed.get("items") or [], uids):
                    self.problem("device_in_two_claims", line)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    def heal(self) -> None:
        for name in list(self.cluster.crashed):
            self.cluster.restart(name)

    # --- the checks -------------------------------------------------------------------------------

    async def settle_kept(self, api: Any) -> list[str]:
        """Pods made after the faults stopped: each Running, or gated with an Event saying why,
        within the bound; the names of those still gated."""
        core = CoreV1Api(api)
        names = []
        for _ in range(self.config.keep_at_end):
            shape, priority = pick(self.rng)
            name = self._next_name("kept")
            self.creates_refused += await create_pod(core, pod(name, priority, template=shape))
            names.append(name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.settle_s
        waiting = list(names)
        while waiting and loop.time() < deadline:
            still = []
            for name in waiting:
                try:
                    found = await read_pod(core, name)
                except KubeApiError as error:
                    if error.not_found:
                        continue  # preempted by a later kept pod: its Event says so
                    raise
                if (found.get("status") or {}).get("phase") == "Running":
                    continue
                if gated(found) and await self._told(core, name, UNSCHEDULABLE_REASON):
                    continue
                still.append(name)
            waiting = still
            if waiting:
                await asyncio.sleep(1.0)
        for name in waiting:
            self.problem(
                "pod_not_settled",
                f"pod {NAMESPACE}/{name} neither Running nor told why it waits "
                f"within {self.config.settle_s:g} s",
            )
        gated_now = []
        for name in names:
            with contextlib.suppress(KubeApiError):
                found = await call_json(
                    f"read Pod {name}", core.read_namespaced_pod(name, NAMESPACE, _preload_content=False)
                )
                if gated(found):
                    gated_now.append(name)
        return gated_now

    async def check_quiet(self, api: Any, bus: Bus, gated_pods: list[str]) -> None:
        """With the cluster quiet: MIG instances match live allocations, the allocator's ledger
        matches the API server, and no pod is gated while capacity for its claim exists."""
        claims: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + QUIET_WITHIN_S
        while True:  # destroys of claims released just before may still be on their way
            claims = await self._claims(api)
            held = mig_devices_by_node(claims)
            differ = []
            for node in self.config.nodes:
                before = self._before[node.name]
                made = {u: name for u, name in self.nodes.mig_devices(node.name).items() if u not in before}
                if line := mig_instances_differ(node.name, made, held.get(node.name, [])):
                    differ.append(line)
            if not differ or loop.time() > deadline:
                break
            await asyncio.sleep(1.0)
        for line in differ:
            self.problem("mig_instances_differ_from_claims", line)
        await self._check_ledger(api)
        await self._check_gated(api, bus, claims, gated_pods)

    async def _claims(self, api: Any) -> list[dict[str, Any]]:
        listed = await retrying(
            lambda: call_json(
                "list ResourceClaims",
                ResourceV1Api(api).list_namespaced_resource_claim(NAMESPACE, _preload_content=False),
            )
        )
        return list(listed.get("items") or [])

    async def _check_ledger(self, api: Any, within_s: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            expected = allocated_by_uid(await self._claims(api))
            differences: list[str] = []
            leader = leading_allocator(self.cluster)
            if leader is None:
                differences = ["no allocator leads"]
            else:
                try:
                    port = logged_health_port(self.cluster.service(leader).log_path)
                    state = await asyncio.to_thread(get_json, f"http://127.0.0.1:{port}/state")
                    ledger = {uid: node for uid, node in (state.get("held") or {}).items()}
                    differences = [
                        f"claim {uid}: API server {expected.get(uid)}, ledger {ledger.get(uid)}"
                        for uid in sorted(set(expected) | set(ledger))
                        if expected.get(uid) != ledger.get(uid)
                    ]
                except (OSError, ValueError, LookupError) as error:
                    differences = [f"the leader's state cannot be read: {error}"]
            if not differences or loop.time() > deadline:
                for line in differences:
                    self.problem("ledger_differs_from_api", line)
                return
            await asyncio.sleep(1.0)

    async def _check_gated(
        self, api: Any, bus: Bus, claims: list[dict[str, Any]], gated_pods: list[str]
    ) -> None:
        """A fleet of the nodes' last inventories holding every live allocation: a gated pod's claim
        that fits there had capacity Tangram did not give it."""
        if not gated_pods:
            return
        fleet = FleetState()
        inventories: dict[str, NodeInventory] = {}
        async for _, event in bus.replay(INVENTORY_STREAM):
            if isinstance(event, NodeInventory):
                inventories[event.hardware.node] = event
        for inventory in inventories.values():
            fleet.apply_inventory(inventory.hardware)
        by_name = {}
        for found in claims:
            metadata = found.get("metadata") or {}
            by_name[metadata.get("name")] = found
            allocation = allocation_of(found)
            results = ((allocation or {}).get("devices") or {}).get("results") or []
            if results:
                fleet.adopt_prepared(
                    str(metadata.get("uid")),
                    str(results[0]["pool"]),
                    [(r["request"], r["device"]) for r in results],
                )
        core = CoreV1Api(api)
        classes = device_classes()
        for name in gated_pods:
            found = await call_json(
                f"read Pod {name}", core.read_namespaced_pod(name, NAMESPACE, _preload_content=False)
            )
            statuses = (found.get("status") or {}).get("resourceClaimStatuses") or []
            for status in statuses:
                wanted = by_name.get(status.get("resourceClaimName"))
                if wanted is None:
                    continue
                metadata = wanted.get("metadata") or {}
                decision = fleet.allocate(
                    Claim(
                        namespace=NAMESPACE,
                        name=str(metadata.get("name")),
                        uid=str(metadata.get("uid")),
                        spec=wanted.get("spec") or {},
                    ),
                    classes,
                )
                if isinstance(decision, Allocated):
                    self.problem(
                        "gated_with_capacity",
                        f"pod {NAMESPACE}/{name} gated while node {decision.node} could hold its claim",
                    )

    async def drain(self, api: Any, within_s: float = 180.0) -> None:
        """Every pod deleted, then until no claim is left and no MIG instance Tangram made."""
        core = CoreV1Api(api)
        listed = await retrying(
            lambda: call_json("list Pods", core.list_namespaced_pod(NAMESPACE, _preload_content=False))
        )
        for found in listed.get("items") or []:
            await delete_pod(core, str(found["metadata"]["name"]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            left = await self._claims(api)
            made = {
                node.name: self.nodes.mig_uuids(node) - self._before[node.name] for node in self.config.nodes
            }
            if not left and not any(made.values()):
                return
            if loop.time() > deadline:
                for found in left:
                    self.problem(
                        "claim_left_behind", f"claim {NAMESPACE}/{found['metadata']['name']} still there"
                    )
                for node, uuids in made.items():
                    for uuid in sorted(uuids):
                        self.problem("instance_leaked", f"node {node}: MIG instance {uuid} without a claim")
                return
            await asyncio.sleep(1.0)

    # --- the whole run ----------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        await asyncio.to_thread(self.plane.start)
        api = await self.plane.client()
        bus: Bus | None = None
        kubelets: list[asyncio.Task[None]] = []
        stop_kubelets, stop_sampler = asyncio.Event(), asyncio.Event()
        try:
            await self.setup(api)
            self._before = {node.name: self.nodes.mig_uuids(node) for node in self.config.nodes}
            kubelets = [
                asyncio.create_task(
                    NodeKubelet(api, node=node.name, dra_socket=self.cluster.dra_socket(node.name)).run(
                        stop_kubelets
                    )
                )
                for node in self.config.nodes
            ]
            bus = await Bus.connect(
                BusConfig(servers=self.cluster.urls, name="chaos", producer="chaos"), wait_s=30
            )
            ready = time.monotonic()
            sampler = asyncio.create_task(self.sampler(api, stop_sampler))
            workers = [asyncio.create_task(self.worker(api)) for _ in range(self.config.concurrency)]
            faults = asyncio.create_task(self.fault_loop(api))
            deadline = started + self.config.duration_limit_s
            # the faults go on past the last pod until each kind has been made once: under load a
            # restart of the API server takes long enough that a short run's pods end first
            while time.monotonic() < deadline and not (
                all(w.done() for w in workers) and self.every_kind_made.is_set()
            ):
                if pending := [w for w in workers if not w.done()]:
                    await asyncio.wait(pending, timeout=1.0)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.every_kind_made.wait(), 1.0)
            self.ending.set()
            await faults
            await asyncio.gather(*workers, *list(self._side))
            self.heal()
            await self.cluster.until_serving(HEAL_TIMEOUT_S)
            if self.webhook is None or self.webhook.process.poll() is not None:
                await self._start_webhook()
            driven = time.monotonic()
            gated_pods = await self.settle_kept(api)
            await self.check_quiet(api, bus, gated_pods)
            settled = time.monotonic()
            await self.drain(api)
            stop_sampler.set()
            await sampler
            log = [event async for _, event in bus.replay(CLAIMS_STREAM)]
            for line in reserved_nodes_taken(log):
                self.problem("reserved_node_taken", line)
            for line in self.cluster.dead():
                self.problem("service_died", line)
            violations = {kind: len(lines) for kind, lines in sorted(self.problems.items()) if lines}
            return {
                "pods": self.begun,
                "seed": self.config.seed,
                "completed": self.begun >= self.config.pods,
                "kubernetes": self.plane.release.version,
                "nodes": {node.name: node.machine for node in self.config.nodes},
                "outcomes": dict(sorted(self.outcomes.items())),
                "faults": {kind: self.faults[kind] for kind in KUBE_FAULT_KINDS},
                "pod_creates_refused_by_admission": self.creates_refused,
                "preemptions": sum(1 for e in log if type(e).__name__ == "ClaimPreempting"),
                "violations": violations,
                "violation_examples": {kind: self.problems[kind][:5] for kind in violations},
                "settle_bound_s": self.config.settle_s,
                "phases_s": {
                    "start": round(ready - started, 1),
                    "pods_and_faults": round(driven - ready, 1),
                    "settle_and_check": round(settled - driven, 1),
                    "drain": round(time.monotonic() - settled, 1),
                },
            }
        finally:
            stop_sampler.set()
            stop_kubelets.set()
            await asyncio.gather(*kubelets, return_exceptions=True)
            if bus is not None:
                await bus.close()
            if self.webhook is not None:
                self.webhook.stop()
            await api.close()


async def kube_chaos(config: KubeChaosConfig) -> tuple[dict[str, Any], LocalCluster]:
    """Start everything, run, check; all stopped after, the work folder returned for the caller."""
    cluster = LocalCluster(list(config.nodes))
    plane = ControlPlane(data_dir=cluster.workdir / "controlplane", release=config.release)
    started = time.monotonic()
    try:
        report = await KubeChaosRun(cluster, plane, config).run()
    finally:
        codes = cluster.stop()
        await asyncio.to_thread(plane.stop)
    report["services_exit_codes"] = codes
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report, cluster
