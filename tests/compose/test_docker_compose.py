"""`docker compose up --build` of the shipped docker-compose.yml, run for real.

The images build from Tangram's Dockerfile on a base image made from Debian's packages
(tangram.local.docker), so nothing is pulled from an image registry; the NATS servers run Tangram's
image with its nats-server. A claim is submitted from the host over the published NATS port, as a
developer's client would, and followed to its MIG instance on the simulated node.

The tests run in file order on one stack: the last takes it down and checks nothing is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from tangram.bus import STREAMS, Bus, BusConfig
from tangram.demo.scenario import mig
from tangram.events import (
    CLAIMS_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimRequested,
    PartitionApplied,
)
from tangram.local.docker import DockerError, base_image, build_compose, client_env, docker, running_engine
from tangram.local.natsserver import free_port
from tests.support.cli import tangram
from tests.support.polling import until

ROOT = Path(__file__).resolve().parents[2]
NODE = "sim-node-1"  # the simulated node docker-compose.yml runs
SERVERS = ("nats", "nats-2", "nats-3")
SERVICES = ("allocator", "discovery", "partitioner", "cdi", "ui")
UP_TIMEOUT_S = 1500.0  # a cold build installs every service's wheels from the package index
WAIT_S = 180.0

pytestmark = pytest.mark.timeout(UP_TIMEOUT_S + 600)


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    nats_url: str
    monitor_url: str  # nats-1's monitoring port
    ui_url: str

    def compose(self, *args: str, timeout: float = 300.0) -> str:
        command = ["compose", "--project-directory", str(ROOT), "-p", self.project, *args]
        return docker(command, env=self.env, timeout=timeout)

    def leftovers(self) -> dict[str, list[str]]:
        """The project's containers, volumes and networks the engine still has."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            kind: docker(
                [kind, "ls", *(["-a"] if kind == "container" else []), "-q", "--filter", label], env=self.env
            ).split()
            for kind in ("container", "volume", "network")
        }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    try:
        build_compose()
        with running_engine(tmp_path_factory.mktemp("dockerd")):
            base = base_image()
            ports = {name: free_port() for name in ("nats", "monitor", "ui")}
            env = client_env(
                {
                    "TANGRAM_BASE_IMAGE": base,
                    "TANGRAM_NATS_PORT": str(ports["nats"]),
                    "TANGRAM_NATS_MONITOR_PORT": str(ports["monitor"]),
                    "TANGRAM_UI_PORT": str(ports["ui"]),
                }
            )
            # no variable of the developer's shell may change what is tested
            for name in ("TANGRAM_NATS_IMAGE", "COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "DOCKER_HOST"):
                env.pop(name, None)
            stack = Stack(
                f"tangram-test-{os.getpid()}",
                env,
                f"nats://127.0.0.1:{ports['nats']}",
                f"http://127.0.0.1:{ports['monitor']}",
                f"http://127.0.0.1:{ports['ui']}",
            )
            try:
                stack.compose("up", "--build", "--detach", "--wait", timeout=UP_TIMEOUT_S)
                yield stack
            finally:
                if any(stack.leftovers().values()):
                    stack.compose("down", "--volumes", "--timeout", "5")
    except DockerError as error:
        pytest.fail(f"Docker cannot run the compose stack here: {str(error).splitlines()[0]}", pytrace=False)


async def connect(stack: Stack) -> Bus:
    config = BusConfig(
        servers=(stack.nats_url,), name="compose-test", producer="compose-test", stream_replicas=3
    )
    return await Bus.connect(config, wait_s=30)


async def submit_mig_claim(bus: Bus, name: str) -> str:
    """A 2g MIG claim: the simulated HGX H200 starts with only a 3g and a 1g instance, so its
    instance is created live."""
    uid = str(uuid.uuid4())
    await bus.publish(ClaimRequested(key=uid, namespace="dev", name=name, uid=uid, spec=mig("2g.")))
    return uid


async def decision(bus: Bus, uid: str) -> ClaimAllocated | ClaimFailed | None:
    events = [event async for _, event in bus.replay(CLAIMS_STREAM)]
    return next((e for e in events if isinstance(e, ClaimAllocated | ClaimFailed) and e.uid == uid), None)


async def created_instance(bus: Bus, uid: str) -> PartitionApplied | None:
    events = [event async for _, event in bus.replay(NODES_STREAM)]
    return next(
        (
            e
            for e in events
            if isinstance(e, PartitionApplied) and e.action == "create" and e.claim_uid == uid
        ),
        None,
    )


async def allocated_with_its_instance(bus: Bus, uid: str) -> tuple[ClaimAllocated, PartitionApplied]:
    decided = await until(f"a decision on {uid}", lambda: decision(bus, uid), WAIT_S, every=0.5)
    assert isinstance(decided, ClaimAllocated), decided
    applied = await until(f"the MIG instance of {uid}", lambda: created_instance(bus, uid), WAIT_S, every=0.5)
    return decided, applied


async def stored(bus: Bus) -> dict[str, list[str]]:
    """The event ids, in stream order, of the streams that keep every event (the inventory stream
    keeps each node's last one only)."""
    return {name: [e.event_id async for _, e in bus.replay(name)] for name in (CLAIMS_STREAM, NODES_STREAM)}


async def led_without(stack: Stack, bus: Bus, server: str) -> bool:
    """Whether the cluster's metadata (consumers are made there: every replay makes one) and every
    stream have a leader other than `server`. The cluster elects new ones when a leader dies;
    until then requests time out."""
    if await asyncio.to_thread(meta_leader, stack) in (None, server):
        return False
    for spec in STREAMS:
        try:
            info = await bus.jetstream.stream_info(spec.name)
        except (TimeoutError, nats.errors.Error):
            return False
        if info.cluster is None or info.cluster.leader in (None, server):
            return False
    return True


def meta_leader(stack: Stack) -> str | None:
    """The metadata leader nats-1's monitoring names; None while there is none (or no answer)."""
    try:
        with urllib.request.urlopen(f"{stack.monitor_url}/jsz", timeout=5) as response:
            leader = json.load(response).get("meta_cluster", {}).get("leader")
    except OSError:
        return None
    return str(leader) if leader else None


def fleet(stack: Stack) -> dict[str, Any]:
    with urllib.request.urlopen(f"{stack.ui_url}/api/fleet", timeout=10) as response:
        data: dict[str, Any] = json.load(response)
    return data


def test_every_service_is_healthy_and_the_streams_are_on_all_three_servers(stack: Stack) -> None:
    states = [json.loads(line) for line in stack.compose("ps", "--format", "json").splitlines() if line]
    health = {state["Service"]: (state["State"], state["Health"]) for state in states}
    assert health == {name: ("running", "healthy") for name in (*SERVERS, *SERVICES)}


async def test_the_streams_are_replicated_on_the_three_servers(stack: Stack) -> None:
    bus = await connect(stack)
    try:
        for spec in STREAMS:
            info = await bus.jetstream.stream_info(spec.name)
            assert info.config.num_replicas == 3, spec.name
            assert info.cluster is not None and info.cluster.leader is not None, spec.name
            peers = {info.cluster.leader, *(peer.name for peer in info.cluster.replicas or [])}
            assert peers == {"nats-1", "nats-2", "nats-3"}, spec.name
    finally:
        await bus.close()


async def test_a_claim_from_the_host_is_allocated_and_its_mig_instance_created(stack: Stack) -> None:
    bus = await connect(stack)
    try:
        uid = await submit_mig_claim(bus, "notebook")
        decided, applied = await allocated_with_its_instance(bus, uid)
    finally:
        await bus.close()
    # the simulated node's inventory reached the allocator: it placed the claim there
    assert decided.node == NODE
    assert applied.node == NODE
    assert [device.profile for device in decided.devices] == ["2g.35gb"]


def test_tangram_status_from_the_host_shows_the_claim_on_the_node(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = tangram(capsys, "status", "--json", "--nats-url", stack.nats_url)
    assert ran.code == 0, ran.err
    status = json.loads(ran.out)
    claims = {c["claim"]: c for c in status["claims"]}
    assert claims["dev/notebook"]["node"] == NODE
    assert claims["dev/notebook"]["state"] in ("allocated", "ready")
    assert [n["name"] for n in status["nodes"]] == [NODE]


async def test_the_web_view_on_the_published_port_shows_the_claim_and_its_instance(stack: Stack) -> None:
    view = await until(
        "the web view shows the claim", lambda: _view_with(stack, "dev/notebook"), WAIT_S, every=0.5
    )
    instances = [i for node in view["nodes"] for gpu in node["gpus"] for i in gpu["instances"]]
    claimed = [i["profile"] for i in instances if i["claim"] == "dev/notebook"]
    assert claimed == ["2g.35gb"]


def _view_with(stack: Stack, claim: str) -> dict[str, Any] | None:
    view = fleet(stack)
    return view if any(c["claim"] == claim for c in view["claims"]) else None


async def test_killing_one_nats_server_loses_nothing(stack: Stack) -> None:
    bus = await connect(stack)
    try:
        before = await stored(bus)
        stack.compose("kill", "nats-2")
        left = "the metadata and every stream led by a server left"
        await until(left, lambda: led_without(stack, bus, "nats-2"), WAIT_S, every=0.5)
        after = await stored(bus)
        # every event stored before is still there (services may have added some since)
        assert {name: ids[: len(before[name])] for name, ids in after.items()} == before
        # two of three keep a quorum: a claim made now is decided and its instance created
        uid = await submit_mig_claim(bus, "after-kill")
        decided, _ = await allocated_with_its_instance(bus, uid)
        assert decided.node == NODE
        names = [e.name async for _, e in bus.replay(CLAIMS_STREAM) if isinstance(e, ClaimRequested)]
        assert names == ["notebook", "after-kill"]
    finally:
        await bus.close()
    stack.compose("start", "nats-2")


def test_down_with_volumes_leaves_nothing_behind(stack: Stack) -> None:
    assert all(stack.leftovers().values())
    stack.compose("down", "--volumes", "--timeout", "10")
    assert stack.leftovers() == {"container": [], "volume": [], "network": []}
