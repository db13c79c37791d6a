"""A chaos run: claims through every service, each its own OS process, on a NATS cluster, while a
seeded scheduler injects faults; then the invariants are checked from the logs and the nodes.

Every claim lives as a kubelet and a user would make it live: requested, decided, prepared over
the node's DRA socket (retried, as kubelet retries, while a plugin restarts), held a moment, then
unprepared and released; the last few are kept prepared, so that CDI files can be compared with
them. Faults never stop: a service killed is restarted, a NATS server killed is restarted before
another is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
import urllib.request
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.ledger import Ledger
from tangram.bus import (
    Bus,
    BusConfig,
    allocator_consumer,
    allocator_log_sources,
    allocator_results_consumer,
)
from tangram.chaos.faults import FAULT_KINDS, FaultKind, fault_order
from tangram.chaos.invariants import (
    claim_stories,
    dead_lettered_ids,
    leaked_instances,
    live_claims,
    overlapping_allocations,
    settle_claims,
    state_differences,
    unanswered_commands,
    undead_lettered,
)
from tangram.demo.scenario import DemoClaim, churn
from tangram.events import (
    CLAIMS_STREAM,
    DEADLETTER_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    EventDecodeError,
    MigPlacement,
    PartitionFailed,
    PartitionRequested,
    decode,
    encode,
    subject_token,
)
from tangram.kubelet.client import ClaimHandle, KubeletClient
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.local.processes import LocalCluster, SimNode
from tangram.nvml import SimNvml, parse_mig_minors, render_mig_minors
from tangram.partitioning import MigExecutor

DEFAULT_NODES = (SimNode("node-a", "hgx-h200"), SimNode("node-b", "dgx-h100"))
SERVICE_RETRY_S = 0.25


@dataclass(frozen=True)
class ChaosConfig:
    claims: int = 300
    seed: int = 1
    duration_limit_s: float = 900.0  # no new claim after this; the checks still run
    nodes: tuple[SimNode, ...] = DEFAULT_NODES
    nats_servers: int = 3
    concurrency: int = 12  # claims alive at once
    fault_interval_s: float = 1.0  # mean time between faults
    keep_at_end: int = 6  # claims left prepared at the end


@dataclass
class _Observed:
    """What the run saw and did, for the checks."""

    driven: list[str] = field(default_factory=list)
    prepared: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    acked: dict[str, str] = field(default_factory=dict)  # event id -> what it was
    must_dead_letter: dict[tuple[str, int], str] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    decisions: dict[str, asyncio.Future[Event]] = field(default_factory=dict)
    recent: deque[tuple[str, bytes]] = field(default_factory=lambda: deque(maxlen=256))
    dead_services: list[str] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)


class ChaosRun:
    def __init__(self, cluster: LocalCluster, config: ChaosConfig) -> None:
        self.cluster = cluster
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - a reproducible run, not a secret
        self.seen = _Observed()
        self._bus: Bus | None = None
        self._next = 0
        self._ending = asyncio.Event()
        self._instances_before: dict[str, set[str]] = {}

    @property
    def bus(self) -> Bus:
        assert self._bus is not None
        return self._bus

    # ---- the run ----------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        config = BusConfig(
            servers=self.cluster.urls,
            name="chaos",
            producer="chaos",
            publish_retry_s=120.0,
            stream_replicas=self.cluster.stream_replicas,
        )
        self._bus = await Bus.connect(config, wait_s=30)
        subscription = await self.bus.nats.subscribe("tangram.>", cb=self._on_message)
        try:
            await self.bus.ensure_streams()
            await self._wait_until_ready()
            ready = time.monotonic()
            self._instances_before = {node.name: self._mig_uuids(node) for node in self.config.nodes}
            workers = [asyncio.create_task(self._worker()) for _ in range(self.config.concurrency)]
            faults = asyncio.create_task(self._faults())
            deadline = started + self.config.duration_limit_s
            while not all(w.done() for w in workers) and time.monotonic() < deadline:
                await asyncio.wait(workers, timeout=1.0)
            self._ending.set()
            await faults
            await asyncio.gather(*workers)
            await self._heal()
            driven = time.monotonic()
            report = await self._check()
            report["phases_s"] = {
                "start": round(ready - started, 1),
                "claims_and_faults": round(driven - ready, 1),
                "checks": round(time.monotonic() - driven, 1),
            }
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
            await self.bus.close()
        report["wall_s"] = round(time.monotonic() - started, 1)
        return report

    async def _on_message(self, msg: Msg) -> None:
        if msg.subject.startswith(("tangram.claim.requested.", "tangram.claim.released.", "tangram.node.")):
            self.seen.recent.append((msg.subject, msg.data))
        if not msg.subject.startswith(("tangram.claim.allocated.", "tangram.claim.failed.")):
            return
        try:
            event = decode(msg.data)
        except EventDecodeError:
            return
        if isinstance(event, ClaimAllocated | ClaimFailed):
            future = self.seen.decisions.get(event.uid)
            if future is not None and not future.done():
                future.set_result(event)

    async def _wait_until_ready(self, timeout_s: float = 90.0) -> None:
        """Every node's kubelet plugin listening and the allocator deciding (a probe claim is decided)."""
        deadline = time.monotonic() + timeout_s
        while not all(self.cluster.dra_socket(n.name).exists() for n in self.config.nodes):
            if dead := self.cluster.dead():
                raise RuntimeError("a service died at start: " + "; ".join(dead))
            if time.monotonic() > deadline:
                raise RuntimeError("the kubelet plugins did not start")
            await asyncio.sleep(0.1)
        probe = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        claim = DemoClaim("chaos", "probe", {"devices": {"requests": []}})
        await self._request(probe, claim)
        if await self._decision(probe, timeout_s=timeout_s) is None:
            raise RuntimeError("the allocator decided nothing")

    # ---- claims ------------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while not self._ending.is_set() and self._next < self.config.claims:
            number = self._next
            self._next += 1
            rng = random.Random(self.config.seed * 1_000_003 + number)  # noqa: S311
            uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            await self._claim_life(number, uid, churn(rng, number), rng)

    async def _claim_life(self, number: int, uid: str, claim: DemoClaim, rng: random.Random) -> None:
        self.seen.driven.append(uid)
        await self._request(uid, claim)
        decision = await self._decision(uid)
        if not isinstance(decision, ClaimAllocated):
            return
        if not await self._kubelet(decision.node, "prepare", ClaimHandle(claim.namespace, uid, claim.name)):
            return
        self.seen.prepared.add(uid)
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        if number >= self.config.claims - self.config.keep_at_end:
            self.seen.held.add(uid)
            return
        await self._kubelet(decision.node, "unprepare", ClaimHandle(claim.namespace, uid, claim.name))
        await self._publish(
            ClaimReleased(key=uid, producer="chaos", namespace=claim.namespace, name=claim.name, uid=uid)
        )

    async def _request(self, uid: str, claim: DemoClaim) -> None:
        self.seen.decisions[uid] = asyncio.get_running_loop().create_future()
        request = ClaimRequested(
            key=uid, producer="chaos", namespace=claim.namespace, name=claim.name, uid=uid, spec=claim.spec
        )
        await self._publish(request)

    async def _publish(self, event: Event) -> None:
        await self.bus.publish(event)
        self.seen.acked[event.event_id] = f"{event.type_name()} {event.key}"

    async def _decision(self, uid: str, timeout_s: float = 120.0) -> Event | None:
        """The claim's decision, as seen live; looked up in the stream when the live copy was missed
        (a subscription does not see what is published while its server restarts)."""
        future = self.seen.decisions[uid]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(future), 5.0)
            for kind in ("allocated", "failed"):
                stored = await self._last(CLAIMS_STREAM, f"tangram.claim.{kind}.{subject_token(uid)}")
                if stored is not None:
                    return stored
        return None

    async def _last(self, stream: str, subject: str) -> Event | None:
        try:
            msg = await self.bus.jetstream.get_last_msg(stream, subject)
        except (nats.js.errors.Error, nats.errors.Error, TimeoutError):
            return None
        try:
            return decode(msg.data or b"")
        except EventDecodeError:
            return None

    async def _kubelet(self, node: str, call: str, handle: ClaimHandle, timeout_s: float = 120.0) -> bool:
        """NodePrepareResources or NodeUnprepareResources, retried as kubelet retries."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                async with KubeletClient(self.cluster.dra_socket(node)) as kubelet:
                    if call == "prepare":
                        answer = (await kubelet.prepare([handle]))[handle.uid]
                        error = answer.error
                    else:
                        error = (await kubelet.unprepare([handle]))[handle.uid]
            except (grpc.RpcError, OSError) as exc:
                error = str(exc)
            if not error:
                return True
            await asyncio.sleep(SERVICE_RETRY_S)
        self.seen.problems.setdefault("kubelet_call_failed", []).append(f"{call} {handle.uid} on {node}")
        return False

    # ---- faults -------------------------------------------------------------------------------------

    async def _faults(self) -> None:
        order = fault_order(self.rng)
        # The claims may all be done before every kind has been injected once: go on until it has.
        while True:
            with contextlib.suppress(TimeoutError):
                pause = self.rng.uniform(0.5, 1.5) * self.config.fault_interval_s
                await asyncio.wait_for(self._ending.wait(), pause)
            if self._ending.is_set() and set(self.seen.faults) >= set(FAULT_KINDS):
                return
            self._revive()
            kind = next(order)
            await self._inject(kind)
            self.seen.faults[kind] += 1

    async def _inject(self, kind: FaultKind) -> None:
        match kind:
            case "kill-service":
                name = self.rng.choice(sorted(p.name for p in self.cluster.processes))
                self.cluster.crash(name)
                await asyncio.sleep(self.rng.uniform(0.1, 1.0))
                self.cluster.restart(name)
            case "kill-nats":
                servers = self.cluster.nats_cluster
                if servers is None:
                    return
                victim = self.rng.choice(servers.running())
                await asyncio.to_thread(servers.kill, victim)
                await asyncio.sleep(self.rng.uniform(0.2, 2.0))
                await asyncio.to_thread(servers.restart, victim)
            case "duplicate":
                await self._duplicate()
            case "reorder":
                uid = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
                claim = churn(self.rng, -1)
                self.seen.driven.append(uid)
                await self._publish(
                    ClaimReleased(
                        key=uid, producer="chaos", namespace=claim.namespace, name=claim.name, uid=uid
                    )
                )
                await self._request(uid, claim)
            case "malformed":
                await self._malformed()
            case "forged":
                await self._forged()
            case "delay-results":
                name = f"partitioner@{self.rng.choice(self.config.nodes).name}"
                process = self.cluster.service(name).process
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGSTOP)
                    try:
                        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
                    finally:
                        os.kill(process.pid, signal.SIGCONT)

    async def _duplicate(self) -> None:
        """A recent input event stored again: once with its own Msg-Id (JetStream keeps one) and
        once under a new one, as an at-least-once redelivery would hand it over twice."""
        if not self.seen.recent:
            return
        subject, data = self.rng.choice(list(self.seen.recent))
        try:
            event = decode(data)
        except EventDecodeError:
            return
        await self._raw(subject, data, event.event_id)
        await self._raw(subject, data, f"{event.event_id}-again")

    async def _malformed(self) -> None:
        node = subject_token(self.rng.choice(self.config.nodes).name)
        targets = [
            (f"tangram.claim.requested.chaos-{self.rng.getrandbits(32):08x}", CLAIMS_STREAM),
            (f"tangram.node.{node}.partition.requested", NODES_STREAM),
        ]
        subject, stream = self.rng.choice(targets)
        garbage = self.rng.choice(
            [
                bytes(self.rng.getrandbits(8) for _ in range(64)),
                b'{"type": "claim.requested", "key": "x"}',
                b"",
            ]
        )
        sequence = await self._raw(subject, garbage, uuid.uuid4().hex)
        self.seen.must_dead_letter[(stream, sequence)] = f"malformed on {subject}"

    async def _forged(self) -> None:
        """A command naming one node sent on another node's subject (that node must refuse it), and a
        result for a command the allocator never issued (nothing may change)."""
        names = [n.name for n in self.config.nodes]
        victim, sender = self.rng.sample(names, 2) if len(names) > 1 else (names[0], names[0])
        gpu = self._gpu_uuids(victim)[0]
        command = PartitionRequested(
            key=subject_token(sender),
            producer="chaos",
            command_id=f"forged-{uuid.uuid4().hex}",
            node=victim,
            action="destroy",
            gpu_uuid=gpu,
            gpu_index=0,
            profile="1g.18gb",
            profile_id=19,
            placement=MigPlacement(start=0, size=1),
        )
        if sender != victim:
            sequence = await self._raw(command.subject, encode(command), command.event_id)
            self.seen.must_dead_letter[(NODES_STREAM, sequence)] = f"command for {victim} sent to {sender}"
        result = PartitionFailed(
            key=subject_token(victim),
            producer="chaos",
            command_id=f"never-issued-{uuid.uuid4().hex}",
            node=victim,
            action="create",
            gpu_uuid=gpu,
            profile="1g.18gb",
            placement=MigPlacement(start=0, size=1),
            claim_uid=str(uuid.uuid4()),
            reason="forged",
        )
        await self._raw(result.subject, encode(result), result.event_id)

    async def _raw(self, subject: str, data: bytes, msg_id: str) -> int:
        ack = await self.bus._api(  # the bus's one choke point, for bytes that are no event
            lambda: self.bus.jetstream.publish(subject, data, timeout=2.0, headers={"Nats-Msg-Id": msg_id}),
            f"publish to {subject}",
            retry_s=120.0,
        )
        return int(ack.seq)

    def _note_dead(self) -> None:
        for line in self.cluster.dead():
            self.seen.dead_services.append(line)

    def _revive(self) -> None:
        """A service that exited on its own is a finding, and is restarted, as a supervisor would."""
        self._note_dead()
        for service in list(self.cluster.processes):
            if service.process.poll() is not None:
                self.cluster.restart(service.name)

    async def _heal(self) -> None:
        """Every NATS server and every service up again before the checks."""
        servers = self.cluster.nats_cluster
        if servers is not None:
            for index in range(servers.size):
                if index not in servers.running():
                    await asyncio.to_thread(servers.restart, index)
        self._revive()

    # ---- checks -------------------------------------------------------------------------------------

    async def _check(self) -> dict[str, Any]:
        letters = await self._settled_dead_letters()
        refused = dead_lettered_ids(letters)
        node_log = await self._settled_node_log(refused)
        log = [event async for _, event in self.bus.replay(CLAIMS_STREAM)]
        stories = claim_stories(log)
        driven = self.seen.driven
        outcomes, problems = settle_claims(
            stories, driven=driven, prepared=self.seen.prepared, held=self.seen.held
        )
        for kind, lines in self.seen.problems.items():
            problems.setdefault(kind, []).extend(lines)
        problems["slice_held_twice"] = overlapping_allocations(log)
        problems["partition_unanswered"] = unanswered_commands(node_log, refused)
        present = {node.name: self._mig_uuids(node) for node in self.config.nodes}
        live = live_claims(stories)
        leaked, missing = leaked_instances(
            present, self._instances_before, node_log, live, warm={}, reused=self._reused_instances(live)
        )
        problems["instance_leaked"] = leaked
        problems["live_instance_missing"] = missing
        on_disk = {uid for node in self.config.nodes for uid in self._cdi_uids(node.name)}
        problems["cdi_mismatch"] = [
            f"spec without prepared claim: {u}" for u in sorted(on_disk - self.seen.held)
        ] + [f"prepared claim without spec: {u}" for u in sorted(self.seen.held - on_disk)]
        problems["allocator_state_differs_from_replay"] = await self._compare_allocator()
        stored_ids = {event.event_id for event in log} | {event.event_id for event in node_log}
        problems["acknowledged_lost"] = [
            what for event_id, what in self.seen.acked.items() if event_id not in stored_ids
        ]
        problems["malformed_not_dead_lettered"] = undead_lettered(self.seen.must_dead_letter, letters)
        problems["service_died"] = list(dict.fromkeys(self.seen.dead_services))
        violations = {kind: len(lines) for kind, lines in sorted(problems.items()) if lines}
        return {
            "claims": len(driven),
            "seed": self.config.seed,
            "completed": self._next >= self.config.claims,
            "nodes": {node.name: node.machine for node in self.config.nodes},
            "nats_servers": self.config.nats_servers,
            "stream_replicas": self.cluster.stream_replicas,
            "outcomes": dict(sorted(outcomes.items())),
            "faults": {kind: self.seen.faults[kind] for kind in FAULT_KINDS},
            "violations": violations,
            "violation_examples": {kind: problems[kind][:5] for kind in violations},
            "dead_letters": len(letters),
            "events": {"claims_log": len(log), "nodes_log": len(node_log)},
        }

    async def _settled_dead_letters(self, timeout_s: float = 60.0) -> list[Event]:
        """The dead letters once every injected bad message has one (or the time is up): the last
        fault may land just before the checks, on a consumer a kill had just restarted."""
        deadline = time.monotonic() + timeout_s
        while True:
            letters = [event async for _, event in self.bus.replay(DEADLETTER_STREAM)]
            if not undead_lettered(self.seen.must_dead_letter, letters) or time.monotonic() > deadline:
                return letters
            await asyncio.sleep(0.5)

    async def _allocator_drained(self, timeout_s: float) -> None:
        """Until the allocator has acknowledged every claim event and partition result (or the time
        is up): a release it must act on may still wait for redelivery to a restarted allocator."""
        deadline = time.monotonic() + timeout_s
        specs = (allocator_consumer(), allocator_results_consumer())
        while time.monotonic() < deadline:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                infos = [await self.bus.jetstream.consumer_info(spec.stream, spec.durable) for spec in specs]
                if all(info.num_pending == 0 and info.num_ack_pending == 0 for info in infos):
                    return
            await asyncio.sleep(0.5)

    async def _settled_node_log(self, refused: set[str], timeout_s: float = 180.0) -> list[Event]:
        """The node log once the allocator has acted on everything and every partition command has
        its result (or the time is up)."""
        deadline = time.monotonic() + timeout_s
        await self._allocator_drained(timeout_s)
        while True:
            node_log = [event async for _, event in self.bus.replay(NODES_STREAM)]
            if not unanswered_commands(node_log, refused) or time.monotonic() > deadline:
                return node_log
            await asyncio.sleep(0.5)

    async def _compare_allocator(self, timeout_s: float = 60.0) -> list[str]:
        """The leader's state, read from its /state, against a ledger rebuilt from the log here;
        asked again while they differ, as the leader may still be folding the last events."""
        deadline = time.monotonic() + timeout_s
        while True:
            replayed = await self._replayed_ledger()
            try:
                live = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{self._allocator_port()}/state")
                differences = state_differences(live, json.loads(json.dumps(replayed)))
            except (OSError, ValueError) as exc:
                differences = [f"the allocator's state cannot be read: {exc}"]
            if not differences or time.monotonic() > deadline:
                return differences
            await asyncio.sleep(1.0)

    async def _replayed_ledger(self) -> dict[str, Any]:
        ledger = Ledger(fleet=FleetState(), classes=_device_classes())
        await self.bus.replay_into(allocator_log_sources(), lambda event: ledger.apply(event, live=False))
        return ledger.snapshot()

    def _allocator_port(self) -> int:
        port = None
        for line in self.cluster.service("allocator").log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("message") == "service starting":
                    port = int(record["health_port"])
        if port is None:
            raise ValueError("the allocator has not logged its health port")
        return port

    # ---- what the nodes show -------------------------------------------------------------------------

    def _sim(self, node: str) -> SimNvml:
        machine = next(n.machine for n in self.config.nodes if n.name == node)
        nvml = SimNvml.from_machine(machine, state_file=self.cluster.state_file(node))
        nvml.nvmlInit()
        return nvml

    def _gpu_uuids(self, node: str) -> list[str]:
        nvml = self._sim(node)
        return [
            nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(nvml.nvmlDeviceGetCount())
        ]

    def _mig_uuids(self, node: SimNode) -> set[str]:
        nvml = self._sim(node.name)
        found = set()
        for index in range(nvml.nvmlDeviceGetCount()):
            device = nvml.nvmlDeviceGetHandleByIndex(index)
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
                with contextlib.suppress(Exception):
                    found.add(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, slot)))
        return found

    def _reused_instances(self, live: Mapping[str, ClaimAllocated]) -> dict[str, set[str]]:
        """Per node, the instances live claims hold that no create of theirs made: each device
        given without a partition command sits on the instance found at its placement."""
        found: dict[str, set[str]] = {}
        for allocation in live.values():
            slots = {
                (device.gpu_index, device.placement.start)
                for device in allocation.devices
                if device.placement is not None and not device.partition_command
            }
            if not slots:
                continue
            executor = MigExecutor(self._sim(allocation.node), minors=parse_mig_minors(render_mig_minors()))
            for gpu_index, start in slots:
                found.setdefault(allocation.node, set()).update(
                    instance.mig_uuid
                    for instance in executor.observe(gpu_index)
                    if instance.placement.start == start and instance.mig_uuid
                )
        return found

    def _cdi_uids(self, node: str) -> set[str]:
        return {path.stem.rsplit("_", 1)[-1] for path in self.cluster.cdi_dir(node).glob("*.json")}


def _device_classes() -> dict[str, DeviceClass]:
    classes = (DeviceClass.from_manifest(m) for m in load_shipped_device_classes())
    return {device_class.name: device_class for device_class in classes}


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - a loopback URL built here
        return json.loads(response.read())


async def chaos(config: ChaosConfig) -> tuple[dict[str, Any], LocalCluster]:
    """Start the cluster, run, check; the cluster is stopped, its folder returned for the caller."""
    cluster = LocalCluster(list(config.nodes), nats_servers=config.nats_servers)
    try:
        cluster.start()
        report = await ChaosRun(cluster, config).run()
    finally:
        codes = cluster.stop()
    report["services_exit_codes"] = codes
    return report, cluster
