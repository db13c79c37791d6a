"""Node identity from Kubernetes: a real nats-server with the auth callout, the callout service
(`python -m services.authcallout`) as its own process, and a real kube-apiserver that issues and
reviews the pods' bound service-account tokens.

No kubelet runs: a Pod is created with `spec.nodeName` set (as the scheduler would bind it) and
its token is requested with the TokenRequest API bound to that Pod, which is what the kubelet
writes into a projected volume.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.js.errors
import pytest
import yaml
from kubernetes_asyncio.client import AuthenticationV1Api, CoreV1Api

from services.authcallout import Refused, TokenReviewer
from services.authcallout.identity import NODE_NAME, POD_NAME
from tangram.bus import Bus, BusConfig, partitioner_consumer
from tangram.events import INVENTORY_STREAM, NODES_STREAM
from tangram.kubernetes.api import call
from tangram.local.controlplane import ControlPlane, register_node
from tangram.local.natsserver import NatsServer, free_port
from tangram.natsauth.jwt import generate_seed, public_key_of
from tangram.natsauth.permissions import (
    ADMIN_USER,
    CALLOUT_USER,
    build_callout_users,
    inbox,
    node_user,
    render_callout_authorization,
)
from tests.support.polling import until
from tests.support.refusals import RefusalRecorder

pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]

DAEMONSET = next(
    d
    for d in yaml.safe_load_all(
        (Path(__file__).resolve().parents[2] / "deploy/kubernetes/node-daemonset.yaml").read_text()
    )
    if d and d["kind"] == "DaemonSet"
)
# the chart's projected token: its audience is what the callout checks
AUDIENCE = next(
    source["serviceAccountToken"]["audience"]
    for volume in DAEMONSET["spec"]["template"]["spec"]["volumes"]
    for source in volume.get("projected", {}).get("sources", [])
    if "serviceAccountToken" in source
)
NODE_SA = DAEMONSET["spec"]["template"]["spec"]["serviceAccountName"]
WAIT_S = 60.0


@dataclass
class Fleet:
    """The NATS server, the callout and a namespace with node-a and node-b, each with a pod."""

    server: NatsServer
    passwords: dict[str, str]
    namespace: str
    nodes: dict[str, str]  # role (a, b) -> Node name
    pods: dict[str, Any] = field(default_factory=dict)  # role -> Pod as created
    callout_log: Path | None = None

    def url(self, user: str | None = None) -> str:
        if user is None:
            return self.server.url
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.server.port}"


async def create_pod(core: CoreV1Api, namespace: str, name: str, node: str, account: str) -> Any:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "node", "image": "ghcr.io/tangram-gpu/tangram-node:0.1.0"}],
        },
    }
    response = await call(
        f"create Pod {name}", core.create_namespaced_pod(namespace, body, _preload_content=False)
    )
    return await response.json()


async def bound_token(
    kube: Any, namespace: str, account: str, pod: Any, *, audience: str = AUDIENCE, expiration_s: int = 600
) -> str:
    """What the kubelet projects into the pod: a token for `audience`, bound to the Pod."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": expiration_s,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    response = await call(
        f"request a token of {account}",
        CoreV1Api(kube).create_namespaced_service_account_token(
            account, namespace, body, _preload_content=False
        ),
    )
    return str((await response.json())["status"]["token"])


@pytest.fixture
def nats_with_callout(tmp_path: Path) -> Iterator[tuple[NatsServer, dict[str, str], str]]:
    seed = generate_seed()
    users = build_callout_users()
    config = tmp_path / "nats.conf"
    config.write_text(render_callout_authorization(users, public_key_of(seed)))
    (tmp_path / "issuer.seed").write_text(seed)
    server = NatsServer(tmp_path / "store", config_file=config).start()
    try:
        yield server, {user.name: user.password for user in users}, seed
    finally:
        server.stop()


@pytest.fixture
async def fleet(
    nats_with_callout: tuple[NatsServer, dict[str, str], str],
    controlplane: ControlPlane,
    kube: Any,
    unique: str,
    tmp_path: Path,
) -> AsyncIterator[Fleet]:
    server, passwords, _ = nats_with_callout
    core = CoreV1Api(kube)
    namespace = unique
    await call("create namespace", core.create_namespace({"metadata": {"name": namespace}}))
    for account in (NODE_SA, "intruder"):
        await call(
            f"create ServiceAccount {account}",
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}}),
        )
    nodes = {"a": f"{unique}-a", "b": f"{unique}-b"}
    for node in nodes.values():
        await register_node(kube, node)
    fleet = Fleet(server, passwords, namespace, nodes)
    for role, node in nodes.items():
        fleet.pods[role] = await create_pod(core, namespace, f"tangram-node-{role}", node, NODE_SA)

    admin = await Bus.connect(
        BusConfig(servers=(fleet.url(ADMIN_USER),), name="admin", producer="admin"), wait_s=30
    )
    await admin.ensure_streams()
    await admin.close()

    fleet.callout_log = tmp_path / "authcallout.log"
    (tmp_path / "callout.url").write_text(fleet.url(CALLOUT_USER))
    log_path = tmp_path / "authcallout.log"
    callout = spawn(
        [
            "services.authcallout",
            "--nats-url-file",
            str(tmp_path / "callout.url"),
            "--issuer-seed-file",
            str(tmp_path / "issuer.seed"),
            "--audience",
            AUDIENCE,
            "--service-account",
            f"{namespace}:{NODE_SA}",
            "--kubeconfig",
            str(controlplane.kubeconfig),
            "--max-ttl",
            "900",  # the test's tokens live 600 s, a rotated one 610 s
        ],
        log_path,
    )
    try:
        await until(
            "the callout starts", lambda: "answering on" in log_path.read_text(), WAIT_S, process=callout
        )
        port = int(log_path.read_text().split("health on port ")[1].split()[0])
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not await _ready(port):
            assert callout.poll() is None and asyncio.get_running_loop().time() < deadline, (
                log_path.read_text()
            )
            await asyncio.sleep(0.1)
        yield fleet
    finally:
        callout.terminate()
        try:
            callout.wait(20)
        except subprocess.TimeoutExpired:
            callout.kill()
            callout.wait()
        assert callout.returncode == 0, log_path.read_text()[-2000:]


def spawn(
    module_args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m <module_args>` in its own session, its output in `log_path`."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", *module_args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _ready(port: int) -> bool:
    """/readyz of a Tangram process answers 200."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/readyz") as answer,
        ):
            return answer.status == 200
    except aiohttp.ClientError:
        return False


async def connect_with(
    fleet: Fleet, token: str, *, user: str | None = None, prefix: str = "x"
) -> RefusalRecorder:
    options: dict[str, Any] = {"token": token}
    if user is not None:
        options = {"user": user, "password": token}
    return await RefusalRecorder().connect(
        fleet.url(), max_reconnect_attempts=0, connect_timeout=10, inbox_prefix=inbox(prefix), **options
    )


async def refused_connection(fleet: Fleet, token: str, **kwargs: Any) -> str:
    with pytest.raises(nats.errors.Error) as refused:
        connection = await connect_with(fleet, token, **kwargs)
        await connection.nc.close()
    return str(refused.value)


async def refused_once_reviewed(fleet: Fleet, token: str) -> str:
    """The refusal of `token`, trying again while connections with it are still let in."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        try:
            connection = await connect_with(fleet, token)
        except nats.errors.Error as refused:
            return str(refused)
        await connection.nc.close()
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the token was still accepted after {WAIT_S}s")
        await asyncio.sleep(0.2)


async def test_a_pod_bound_token_becomes_its_nodes_identity_and_no_other(fleet: Fleet, kube: Any) -> None:
    node_a, node_b = fleet.nodes["a"], fleet.nodes["b"]
    token = await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["a"])
    user_a = node_user(node_a)
    connection = await connect_with(fleet, token, prefix=user_a)
    try:
        # node-a's own inventory subject is stored by JetStream (the ack proves it)...
        js = connection.nc.jetstream()
        ack = await js.publish(f"tangram.inventory.{node_a}", b"{}", stream=INVENTORY_STREAM)
        assert ack.stream == INVENTORY_STREAM
        # ...and so is a partition command to its own partitioner (cdi's, for the claims
        # kube-scheduler allocated), the same rule as a static node user's...
        ack = await js.publish(f"tangram.node.{node_a}.partition.requested", b"{}", stream=NODES_STREAM)
        assert ack.stream == NODES_STREAM
        # ...node-b's facts and commands and claim decisions are not node-a's to say.
        for subject in (
            f"tangram.inventory.{node_b}",
            f"tangram.node.{node_b}.partition.applied",
            f"tangram.node.{node_b}.partition.requested",
            "tangram.claim.allocated.0d4c3b7e-0000-4000-8000-000000000001",
        ):
            assert await connection.refused(subject), subject
        # node-b's durable cannot be read or rewritten by node-a's identity
        durable_b = partitioner_consumer(node_b).durable
        assert await connection.refused(f"$JS.API.CONSUMER.INFO.{NODES_STREAM}.{durable_b}")
    finally:
        await connection.nc.close()
    # the server names the connection by the user the callout issued (its log is read as written)
    await until(
        "the server logs it", lambda: any("Publish Violation" in line for line in fleet.server.log), WAIT_S
    )
    refusals = [line for line in fleet.server.log if "Publish Violation" in line]
    assert all(f"TANGRAM/user:{user_a}" in line for line in refusals), refusals


async def test_the_token_decides_the_node_not_what_the_client_says(fleet: Fleet, kube: Any) -> None:
    """node-a's token presented as user `node-<node-b>` still gets node-a's identity."""
    node_a, node_b = fleet.nodes["a"], fleet.nodes["b"]
    token = await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["a"])
    connection = await connect_with(fleet, token, user=node_user(node_b), prefix=node_user(node_a))
    try:
        assert await connection.refused(f"tangram.inventory.{node_b}")
        ack = await connection.nc.jetstream().publish(
            f"tangram.inventory.{node_a}", b"{}", stream=INVENTORY_STREAM
        )
        assert ack.stream == INVENTORY_STREAM
    finally:
        await connection.nc.close()


async def test_tokens_that_prove_no_node_are_refused(fleet: Fleet, kube: Any) -> None:
    core = CoreV1Api(kube)
    # another service account of the same namespace, on node-a
    intruder_pod = await create_pod(core, fleet.namespace, "intruder", fleet.nodes["a"], "intruder")
    intruder = await bound_token(kube, fleet.namespace, "intruder", intruder_pod)
    assert "Authorization Violation" in await refused_connection(fleet, intruder)
    # an account of the same name in another namespace
    elsewhere = f"{fleet.namespace}-x"
    await call("create namespace", core.create_namespace({"metadata": {"name": elsewhere}}))
    await call(
        f"create ServiceAccount {NODE_SA} in {elsewhere}",
        core.create_namespaced_service_account(elsewhere, {"metadata": {"name": NODE_SA}}),
    )
    lookalike_pod = await create_pod(core, elsewhere, "tangram-node-a", fleet.nodes["a"], NODE_SA)
    lookalike = await bound_token(kube, elsewhere, NODE_SA, lookalike_pod)
    assert "Authorization Violation" in await refused_connection(fleet, lookalike)
    # the right account, but a token meant for another audience
    other_audience = await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["a"], audience="elsewhere")
    assert "Authorization Violation" in await refused_connection(fleet, other_audience)
    # garbage, and a token whose signature was tampered with
    assert "Authorization Violation" in await refused_connection(fleet, "not-a-token")
    good = await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["b"])
    header, claims, signature = good.split(".")
    assert "Authorization Violation" in await refused_connection(
        fleet, f"{header}.{claims}.{signature[::-1]}"
    )
    # no token at all
    assert "Authorization Violation" in await refused_connection(fleet, "")
    # a token of a deleted pod: node-b's pod is gone, so is its identity
    await call(
        "delete Pod tangram-node-b",
        core.delete_namespaced_pod("tangram-node-b", fleet.namespace, grace_period_seconds=0),
    )
    assert fleet.callout_log is not None
    log = fleet.callout_log

    def refusals() -> int:
        return log.read_text().count('"connection refused"')

    before = refusals()
    # the API server's token review sees the pod gone once its own cache does: a connection may
    # still be let in just after the delete, never once the deletion has reached the review
    assert "Authorization Violation" in await refused_once_reviewed(fleet, good)
    await until("the callout refused the deleted pod's token", lambda: refusals() > before, WAIT_S)
    assert "not authenticated" in log.read_text().splitlines()[-1]


async def test_node_services_start_with_only_the_projected_token(
    fleet: Fleet, kube: Any, tmp_path: Path
) -> None:
    """discovery and partitioner of node-a, as their own processes, with the token file the
    kubelet would project and no NATS credentials: node-a's inventory is stored and its
    partitioner's durable exists."""
    node_a = fleet.nodes["a"]
    token_file = tmp_path / "token"
    token_file.write_text(await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["a"]))
    containers = {c["name"]: c for c in DAEMONSET["spec"]["template"]["spec"]["containers"]}
    chart_env = {e["name"] for e in containers["discovery"]["env"] if e["name"].startswith("TANGRAM_NATS")}
    # the chart's NATS settings, pointed at this test's server and token file: nothing else
    assert chart_env == {"TANGRAM_NATS_URL", "TANGRAM_NATS_TOKEN_FILE", "TANGRAM_NATS_STREAM_REPLICAS"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANGRAM_NATS")}
    env |= {
        "TANGRAM_NATS_URL": fleet.url(),
        "TANGRAM_NATS_TOKEN_FILE": str(token_file),
        "TANGRAM_NODE_NAME": node_a,
        "TANGRAM_LOG_LEVEL": "info",
    }
    sim = ["--sim", "a100-pcie-2x2", "--state-file", str(tmp_path / "gpus.json")]
    processes: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    for service in ("discovery", "partitioner"):
        port = free_port()
        log_path = tmp_path / f"{service}.log"
        processes[service] = (
            spawn([f"services.{service}", *sim], log_path, {**env, "TANGRAM_HEALTH_PORT": str(port)}),
            port,
        )

    def logs() -> str:
        return "\n".join(f"{s}: {(tmp_path / f'{s}.log').read_text()[-1500:]}" for s in processes)

    admin = await Bus.connect(
        BusConfig(servers=(fleet.url(ADMIN_USER),), name="admin", producer="admin"), wait_s=30
    )
    try:
        js = admin.jetstream

        async def stored() -> bool:
            try:
                await js.get_last_msg(INVENTORY_STREAM, f"tangram.inventory.{node_a}")
            except nats.js.errors.NotFoundError:
                return False
            return True

        async def durable() -> bool:
            try:
                await js.consumer_info(NODES_STREAM, partitioner_consumer(node_a).durable)
            except nats.js.errors.NotFoundError:
                return False
            return True

        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not (
            all([await _ready(port) for _, port in processes.values()]) and await stored() and await durable()
        ):
            dead = [name for name, (p, _) in processes.items() if p.poll() is not None]
            assert not dead, f"exited: {dead}\n{logs()}"
            assert asyncio.get_running_loop().time() < deadline, logs()
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
        for process, _ in processes.values():
            process.terminate()
        codes = [process.wait(30) for process, _ in processes.values()]
    assert codes == [0, 0], logs()
    granted = (tmp_path / "authcallout.log").read_text().count(f'"user": "{node_user(node_a)}"')
    assert granted >= 2, "each service got node-a's user from the callout"


async def test_the_review_binds_the_token_to_its_pods_node(fleet: Fleet, kube: Any) -> None:
    """The API server names the node in a pod-bound token's review (1.32+); the Pod says the same."""
    reviewer = TokenReviewer(
        kube, audience=AUDIENCE, service_accounts=frozenset({f"{fleet.namespace}:{NODE_SA}"})
    )
    token = await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["b"])
    identity = await reviewer.review(token)
    assert identity.node == fleet.nodes["b"] and identity.pod == "tangram-node-b"
    assert identity.namespace == fleet.namespace
    assert identity.expires_at is not None and 0 < identity.expires_at - time.time() <= 600
    assert await reviewer.node_of_pod(fleet.namespace, "tangram-node-b") == fleet.nodes["b"]
    # the API server itself names the node (1.32+), so the callout reads no Pod for it
    body = {"spec": {"token": token, "audiences": [AUDIENCE]}}
    response = await AuthenticationV1Api(kube).create_token_review(body, _preload_content=False)
    extra = (await response.json())["status"]["user"]["extra"]
    assert extra[NODE_NAME] == [fleet.nodes["b"]] and extra[POD_NAME] == ["tangram-node-b"]
    with pytest.raises(Refused, match="not authenticated"):
        await reviewer.review(token[:-4] + "AAAA")
    strict = TokenReviewer(kube, audience=AUDIENCE, service_accounts=frozenset({f"{fleet.namespace}:other"}))
    with pytest.raises(Refused, match="does not run node services"):
        await strict.review(token)


async def test_a_connection_renews_its_user_with_the_rotated_token(
    fleet: Fleet, kube: Any, tmp_path: Path
) -> None:
    """Rotation: before the token a connection was made with expires (here: 5 s after it was
    issued, by asking for renewal 595 s before its 600 s are up), the bus reconnects with what
    the token file holds now. The first token's pod is deleted by then, so only the rotated
    token can have been accepted."""
    node_a = fleet.nodes["a"]
    core = CoreV1Api(kube)
    token_file = tmp_path / "token"
    token_file.write_text(await bound_token(kube, fleet.namespace, NODE_SA, fleet.pods["a"]))
    config = BusConfig(
        servers=(fleet.url(),),
        name="rotation",
        producer="test",
        token_file=str(token_file),
        user=node_user(node_a),
        token_renew_margin_s=595,
    )
    bus = await Bus.connect(config, wait_s=30)
    try:
        ack = await bus.jetstream.publish(f"tangram.inventory.{node_a}", b"{}", stream=INVENTORY_STREAM)
        assert ack.stream == INVENTORY_STREAM
        second = await create_pod(core, fleet.namespace, "tangram-node-a2", node_a, NODE_SA)
        await call(
            "delete Pod tangram-node-a",
            core.delete_namespaced_pod("tangram-node-a", fleet.namespace, grace_period_seconds=0),
        )
        # the kubelet's next token: it expires later than the first
        token_file.write_text(await bound_token(kube, fleet.namespace, NODE_SA, second, expiration_s=610))
        assert fleet.callout_log is not None
        log = fleet.callout_log
        await until(
            "a user for the rotated token",
            lambda: f"{fleet.namespace}/tangram-node-a2" in log.read_text(),
            WAIT_S,
        )
        await until("reconnected", lambda: bus.nats.is_connected, WAIT_S)
        ack = await bus.jetstream.publish(f"tangram.inventory.{node_a}", b"{}", stream=INVENTORY_STREAM)
        assert ack.stream == INVENTORY_STREAM
        assert not bus.nats.is_closed
    finally:
        await bus.close()
