"""The kubelet plugin in Kubernetes mode: claims read from an API server over HTTP, MIG placements
made by the node's partitioner over a real nats-server, prepared through the real DRA socket."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from services.cdi.service import run as run_cdi
from services.cdi.settings import CdiSettings
from services.partitioner.service import run as run_partitioner
from services.partitioner.settings import PartitionerSettings
from tangram.bus import Bus
from tangram.cdi.simroot import lay_out_driver_root
from tangram.events import Event, PartitionApplied, PartitionRequested, decode
from tangram.hardware.machines import load_machine
from tangram.local.natsserver import NatsServer
from tangram.partitioning import MigExecutor
from tangram.partitioning.model import ObservedInstance
from tangram.service import ServiceContext
from tests.kubelet.fakes import TestKubelet
from tests.kubernetes.api.apiserver import ApiError, LocalApiServer
from tests.partitioner.helpers import MINORS, sim
from tests.support.driver import DRIVER

NODE = "node-k"
MACHINE = "hgx-h200"  # GPU 0 in MIG mode with instances at slices 0 and 4; GPUs 1-7 whole
MIG_DEVICE = "gpu-1-mig-1g-18gb-0"  # a 1g.18gb placement at slice 0 of GPU 1, not made yet


def resource_claim(
    name: str,
    devices: list[str],
    *,
    driver: str = DRIVER,
    pool: str = NODE,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A claim as kube-scheduler leaves it: spec, and the allocation in its status."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "mig.gpu.tangram.dev", "count": len(devices)},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver, "pool": pool, "device": device}
                        for device in devices
                    ],
                    "config": config or [],
                }
            }
        },
    }


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


class Commands:
    """Every partition command and result of the node, as the bus carries them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Condition()

    async def deliver(self, msg: Msg) -> None:
        async with self._changed:
            self.events.append(decode(msg.data))
            self._changed.notify_all()

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for_destroys(self, count: int) -> list[PartitionApplied]:
        def destroys() -> list[PartitionApplied]:
            return [e for e in self.of(PartitionApplied) if e.action == "destroy"]

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(destroys()) >= count), 20)
        return destroys()


@dataclass
class Node:
    kubelet: TestKubelet
    endpoint: str
    cdi_dir: Path
    state: Path
    commands: Commands

    def instances(self, gpu: int) -> list[ObservedInstance]:
        return MigExecutor(sim(MACHINE, self.state), minors=MINORS).observe(gpu)

    def mig_enabled(self, gpu: int) -> bool:
        nvml = sim(MACHINE, self.state)
        return bool(nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(gpu))[0])

    def spec_text(self, uid: str) -> str:
        return (self.cdi_dir / f"gpu.tangram.dev-claim_{uid}.json").read_text()


@asynccontextmanager
async def service(name: str, bus: Bus, main: Any) -> AsyncIterator[None]:
    ctx = ServiceContext(name=name, bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(main(ctx))
    ready = asyncio.create_task(ctx.ready.wait())
    await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED, timeout=30)
    if not ready.done():
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        await task
        raise AssertionError(f"{name} did not become ready")
    try:
        yield
    finally:
        ctx.stop.set()
        await task


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))  # socket paths must stay short
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def apiserver() -> AsyncIterator[LocalApiServer]:
    server = LocalApiServer(k8s_version="1.34")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def node(
    nats_server: NatsServer, bus: Bus, apiserver: LocalApiServer, tmp_path: Path, kubelet_root: Path
) -> AsyncIterator[Node]:
    state = tmp_path / "gpus.json"
    commands = Commands()
    await bus.nats.subscribe(f"tangram.node.{NODE}.partition.*", cb=commands.deliver)
    partitioner = PartitionerSettings(
        nats_urls=(nats_server.url,), node_name=NODE, sim_machine=MACHINE, state_file=state
    )
    cdi = CdiSettings(
        nats_urls=(nats_server.url,),
        node_name=NODE,
        kubelet_root=kubelet_root,
        cdi_dir=tmp_path / "cdi",
        driver_root=lay_out_driver_root(tmp_path / "driver", load_machine(MACHINE).driver_version),
        resolve_timeout_s=20.0,
        kubernetes=True,
        kubeconfig=kubeconfig(tmp_path / "kubeconfig", apiserver.url),
    )
    kubelet = TestKubelet(kubelet_root)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            service("partitioner", bus, lambda ctx: run_partitioner(ctx, partitioner))
        )
        await stack.enter_async_context(service("cdi", bus, lambda ctx: run_cdi(ctx, cdi)))
        endpoint = str(kubelet_root / "plugins" / DRIVER / "dra.sock")
        try:
            yield Node(kubelet, endpoint, tmp_path / "cdi", state, commands)
        finally:
            await kubelet.close()


async def test_a_mig_placement_is_made_at_prepare_and_destroyed_at_unprepare(
    node: Node, apiserver: LocalApiServer
) -> None:
    stored = apiserver.put_claim(resource_claim("small", [MIG_DEVICE]))
    ref = ("ml", "small", stored["metadata"]["uid"])
    assert node.instances(1) == []

    answer = (await node.kubelet.prepare(node.endpoint, [ref]))[ref[2]]
    assert answer.error == ""
    [(requests, pool, device, cdi_ids)] = answer.devices
    assert (requests, pool, device) == (["gpu"], NODE, MIG_DEVICE)
    assert cdi_ids == [f"{DRIVER}/claim={ref[2]}-{MIG_DEVICE}"]
    [instance] = node.instances(1)
    assert (instance.profile, instance.placement.start, instance.placement.size) == ("1g.18gb", 0, 1)
    assert instance.mig_uuid in node.spec_text(ref[2])
    [create] = node.commands.of(PartitionRequested)
    assert (create.action, create.claim_uid, create.producer) == ("create", ref[2], f"cdi@{NODE}")

    again = (await node.kubelet.prepare(node.endpoint, [ref]))[ref[2]]
    assert again == answer
    assert [i.mig_uuid for i in node.instances(1)] == [instance.mig_uuid]

    assert await node.kubelet.unprepare(node.endpoint, [ref]) == {ref[2]: ""}
    [destroyed] = await node.commands.wait_for_destroys(1)
    assert (destroyed.mig_uuid, destroyed.claim_uid) == (instance.mig_uuid, ref[2])
    assert node.instances(1) == []
    assert not (node.cdi_dir / f"gpu.tangram.dev-claim_{ref[2]}.json").exists()

    # The same claim prepared again on this node (a new pod sharing it) gets a new instance.
    third = (await node.kubelet.prepare(node.endpoint, [ref]))[ref[2]]
    assert third.error == ""
    [remade] = node.instances(1)
    assert remade.mig_uuid != instance.mig_uuid and remade.mig_uuid in node.spec_text(ref[2])
    assert await node.kubelet.unprepare(node.endpoint, [ref]) == {ref[2]: ""}
    await node.commands.wait_for_destroys(2)
    assert node.instances(1) == []


async def test_a_whole_gpu_left_in_mig_mode_leaves_it_at_prepare(
    node: Node, apiserver: LocalApiServer
) -> None:
    mig = apiserver.put_claim(resource_claim("first", [MIG_DEVICE]))
    first = ("ml", "first", mig["metadata"]["uid"])
    assert (await node.kubelet.prepare(node.endpoint, [first]))[first[2]].error == ""
    assert await node.kubelet.unprepare(node.endpoint, [first]) == {first[2]: ""}
    await node.commands.wait_for_destroys(1)
    assert node.mig_enabled(1) and node.instances(1) == []  # MIG mode stays on, empty

    whole = apiserver.put_claim(resource_claim("whole", ["gpu-1"]))
    ref = ("ml", "whole", whole["metadata"]["uid"])
    answer = (await node.kubelet.prepare(node.endpoint, [ref]))[ref[2]]
    assert answer.error == ""
    assert not node.mig_enabled(1)
    assert [c.action for c in node.commands.of(PartitionRequested)] == ["create", "destroy", "disable-mig"]


async def test_claims_that_are_not_this_nodes_to_prepare_fail_with_the_reason(
    node: Node, apiserver: LocalApiServer
) -> None:
    bad_config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "interconnect": "Carrier-Pigeon",
                },
            },
        }
    ]
    claims = {
        "malformed": apiserver.put_claim(resource_claim("malformed", [MIG_DEVICE], config=bad_config)),
        "other-driver": apiserver.put_claim(
            resource_claim("other-driver", ["dev-0"], driver="gpu.example.com")
        ),
        "other-node": apiserver.put_claim(resource_claim("other-node", [MIG_DEVICE], pool="node-z")),
        "recreated": apiserver.put_claim(resource_claim("recreated", [MIG_DEVICE])),
        "good": apiserver.put_claim(resource_claim("good", ["gpu-3"])),
    }
    refs = [("ml", name, obj["metadata"]["uid"]) for name, obj in claims.items()]
    refs[3] = ("ml", "recreated", "0f5e7c1a-0000-4000-8000-000000000001")  # kubelet knew an older claim
    refs.append(("ml", "missing", "0f5e7c1a-0000-4000-8000-000000000002"))
    answers = await node.kubelet.prepare(node.endpoint, refs)
    errors = {name: answers[uid].error for _, name, uid in refs}
    assert "status.allocation.devices.config[0].opaque.parameters.interconnect" in errors["malformed"]
    assert f"holds no device of driver {DRIVER}" in errors["other-driver"]
    assert "gpu.example.com" in errors["other-driver"]
    assert "status.allocation.devices.results[0].pool is 'node-z'" in errors["other-node"]
    assert "kubelet asked for '0f5e7c1a-0000-4000-8000-000000000001'" in errors["recreated"]
    assert errors["missing"] == "ResourceClaim ml/missing does not exist"
    assert errors["good"] == ""
    assert [d[2] for d in answers[refs[4][2]].devices] == ["gpu-3"]
    # Nothing was made for a refused claim: the one command is the good claim's (MIG is already off).
    assert [(c.action, c.claim_uid) for c in node.commands.of(PartitionRequested)] == [
        ("disable-mig", refs[4][2])
    ]
    assert node.instances(1) == []


NIC_STATUS = {
    "driver": "nic.example.com",
    "pool": NODE,
    "device": "nic-0",
    "data": {"mtu": 9000},
    "networkData": {"interfaceName": "net1", "ips": ["10.9.0.7/24"]},
}


def with_a_nic(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim with a second driver's device, whose driver already wrote its status entry."""
    claim["spec"]["devices"]["requests"].append(
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
    )
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "nic-0"}
    )
    claim["status"]["devices"] = [NIC_STATUS]
    return claim


async def test_the_claim_status_shows_the_prepared_mig_device_until_unprepare(
    node: Node, apiserver: LocalApiServer
) -> None:
    stored = apiserver.put_claim(with_a_nic(resource_claim("small", [MIG_DEVICE])))
    ref = ("ml", "small", stored["metadata"]["uid"])
    assert (await node.kubelet.prepare(node.endpoint, [ref]))[ref[2]].error == ""
    [instance] = node.instances(1)
    nic, entry = apiserver.claim("ml", "small")["status"]["devices"]
    assert nic == NIC_STATUS
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, MIG_DEVICE)
    # the UUID the container is given (its CDI spec) is the one the claim shows
    assert entry["data"]["uuid"] == instance.mig_uuid and instance.mig_uuid in node.spec_text(ref[2])
    assert entry["data"]["profile"] == "1g.18gb"
    assert entry["data"]["gpuInstanceId"] == instance.gpu_instance_id
    assert entry["data"]["gpuUUID"] == instance.gpu_uuid
    ready = entry["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")

    assert await node.kubelet.unprepare(node.endpoint, [ref]) == {ref[2]: ""}
    assert apiserver.claim("ml", "small")["status"]["devices"] == [NIC_STATUS]


async def test_a_status_the_server_refuses_or_drops_still_prepares(
    node: Node, apiserver: LocalApiServer
) -> None:
    def broken(claim: dict[str, Any]) -> None:
        raise ApiError(500, "InternalError", "etcd is unhappy")

    refused = apiserver.put_claim(resource_claim("refused", ["gpu-2"]))
    ref = ("ml", "refused", refused["metadata"]["uid"])
    apiserver.race_next_claim_status(broken)
    answer = (await node.kubelet.prepare(node.endpoint, [ref]))[ref[2]]
    assert answer.error == "" and [d[2] for d in answer.devices] == ["gpu-2"]
    assert node.spec_text(ref[2])
    assert "devices" not in apiserver.claim("ml", "refused")["status"]

    apiserver.serves_device_status = False
    dropped = apiserver.put_claim(resource_claim("dropped", ["gpu-3"]))
    other = ("ml", "dropped", dropped["metadata"]["uid"])
    assert (await node.kubelet.prepare(node.endpoint, [other]))[other[2]].error == ""
    assert await node.kubelet.unprepare(node.endpoint, [ref, other]) == {ref[2]: "", other[2]: ""}
