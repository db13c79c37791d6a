"""The workload of a chaos run: claims that live as a kubelet and a user make them live, and the
faults injected meanwhile.

Every claim is requested, decided, prepared over the node's DRA socket (retried, as kubelet
retries, while a plugin restarts), held a moment, then unprepared and released; the last few are
kept prepared, so that CDI files can be compared with them. Faults never stop while the claims
flow: a service killed is restarted, a NATS server killed is restarted before another is killed.
What the workload sees and does is noted in `Observed`, for the checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

import grpc
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from tangram.bus import Bus
from tangram.chaos.config import ChaosConfig
from tangram.chaos.faults import FAULT_KINDS, FaultKind, fault_order
from tangram.chaos.nodes import NodeView
from tangram.demo.scenario import DemoClaim, churn
from tangram.events import (
    CLAIMS_STREAM,
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
from tangram.local.processes import LocalCluster

SERVICE_RETRY_S = 0.25
HEAL_TIMEOUT_S = 60.0  # for every restarted service to serve again before the checks


@dataclass
class Observed:
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


class ChaosWorkload:
    """The claims and the faults of one run, on a cluster whose bus is connected."""

    def __init__(
        self,
        cluster: LocalCluster,
        config: ChaosConfig,
        bus: Bus,
        *,
        rng: random.Random,
        seen: Observed,
        nodes: NodeView,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.bus = bus
        self.rng = rng  # the run's: the faults' choices follow the seed
        self.seen = seen
        self.nodes = nodes
        self.begun = 0  # claims begun: the next claim's number
        self.ending = asyncio.Event()  # no new claim; the faults stop once every kind was injected

    async def on_message(self, msg: Msg) -> None:
        """Each message on the bus: recent inputs (what a duplicate repeats), and decisions."""
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

    # ---- claims ------------------------------------------------------------------------------------

    async def worker(self) -> None:
        while not self.ending.is_set() and self.begun < self.config.claims:
            number = self.begun
            self.begun += 1
            rng = random.Random(self.config.seed * 1_000_003 + number)  # noqa: S311
            uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            await self._claim_life(number, uid, churn(rng, number), rng)

    async def _claim_life(self, number: int, uid: str, claim: DemoClaim, rng: random.Random) -> None:
        self.seen.driven.append(uid)
        await self.request(uid, claim)
        decision = await self.decision(uid)
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

    async def request(self, uid: str, claim: DemoClaim) -> None:
        self.seen.decisions[uid] = asyncio.get_running_loop().create_future()
        request = ClaimRequested(
            key=uid, producer="chaos", namespace=claim.namespace, name=claim.name, uid=uid, spec=claim.spec
        )
        await self._publish(request)

    async def _publish(self, event: Event) -> None:
        await self.bus.publish(event)
        self.seen.acked[event.event_id] = f"{event.type_name()} {event.key}"

    async def decision(self, uid: str, timeout_s: float = 120.0) -> Event | None:
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

    async def faults(self) -> None:
        order = fault_order(self.rng)
        # The claims may all be done before every kind has been injected once: go on until it has.
        while True:
            with contextlib.suppress(TimeoutError):
                pause = self.rng.uniform(0.5, 1.5) * self.config.fault_interval_s
                await asyncio.wait_for(self.ending.wait(), pause)
            if self.ending.is_set() and set(self.seen.faults) >= set(FAULT_KINDS):
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
                await self.request(uid, claim)
            case "malformed":
                await self._malformed()
            case "forged":
                await self._forged()
            case "delay-results":
                name = f"partitioner@{self.rng.choice(self.config.nodes).name}"
                with self.cluster.frozen(name):
                    await asyncio.sleep(self.rng.uniform(0.5, 3.0))

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
        gpu = self.nodes.gpu_uuids(victim)[0]
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

    async def heal(self) -> None:
        """Every NATS server and every service up again before the checks."""
        servers = self.cluster.nats_cluster
        if servers is not None:
            for index in range(servers.size):
                if index not in servers.running():
                    await asyncio.to_thread(servers.restart, index)
        self._revive()
        # A service restarted by the last fault may still be importing: up means serving, and only
        # then does the SIGTERM that ends the run stop it gracefully. Past the timeout the checks
        # report what is down.
        await self.cluster.until_serving(HEAL_TIMEOUT_S)
