"""A local Kubernetes with Tangram: the real control plane, Tangram's services on simulated GPUs,
and a kubelet stand-in per node, until stopped.

The control plane is the one the tests run (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler from one of the releases built, `tangram.local.controlplane`). Each simulated node
is a Node object, its discovery publishing ResourceSlices, its partitioner, and its cdi service
reading claims from the API server. The stand-ins prepare the claims of pods bound to their node
through the DRA socket and mark the pods Running.

Who decides the claims (`decider`):

- "tangram", as the Helm chart runs Tangram: the chart's admission webhook
  (`tangram.local.admission`) adds the scheduling gate `gpu.tangram.dev/allocation` to pods that use
  Tangram's claims, and the allocator, in Kubernetes mode (its Lease in the namespace `tangram`),
  writes their allocation and lifts the gate; kube-scheduler then binds the pod to the node the
  allocation names. A claim that cannot be placed gets a `TangramUnschedulable` Warning Event and
  its pod stays gated.
- "kube-scheduler": no webhook; kube-scheduler allocates from Tangram's ResourceSlices, and the
  allocator learns what it allocated from the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from kubernetes_asyncio.client import CoordinationV1Api, CoreV1Api, ResourceV1Api

from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.alive import ALLOCATOR_LEASE
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.local import admission, helm
from tangram.local.controlplane import NEWEST, ControlPlane, Release, register_node
from tangram.local.kubelet import NodeKubelet
from tangram.local.processes import LocalCluster, SimNode
from tangram.service import first, settle

READY = "tangram cluster: ready "
Decider = Literal["tangram", "kube-scheduler"]
DECIDERS: tuple[Decider, ...] = get_args(Decider)
# Where the chart installs Tangram: the webhook's Secret and the allocator's Lease live there.
NAMESPACE = helm.NAMESPACE
WAIT_S = 180.0  # each step of becoming ready, on a loaded 2-core machine
# The webhook's ServiceAccount token: as long as its certificate, so a cluster left running keeps
# gating (the control plane here sets no maximum).
WEBHOOK_TOKEN_S = 365 * 86400


@dataclass(frozen=True)
class Running:
    """What `tangram cluster up` tells a person (and a test) once everything answers."""

    kubeconfig: Path
    server: str
    nodes: list[str]
    workdir: Path
    decider: Decider = "tangram"
    kubernetes: str = NEWEST.version
    nats: str = ""

    def line(self) -> str:
        return READY + json.dumps(
            {
                "kubeconfig": str(self.kubeconfig),
                "server": self.server,
                "nodes": self.nodes,
                "workdir": str(self.workdir),
                "decider": self.decider,
                "kubernetes": self.kubernetes,
                "nats": self.nats,
            }
        )


async def install_device_classes(api: Any) -> None:
    resource = ResourceV1Api(api)
    for manifest in load_shipped_device_classes():
        name = manifest["metadata"]["name"]
        try:
            await call(f"create DeviceClass {name}", resource.create_device_class(manifest))
        except KubeApiError as error:
            if not error.already_exists:
                raise


def helm_binary(out: Callable[[str], None]) -> Path:
    """Helm, to render the chart's admission objects: the cached build, built now when missing
    (as `make helm` does; it needs Go)."""
    try:
        return helm.find_binary()
    except helm.HelmError:
        out("tangram cluster: Helm renders the chart's admission webhook and is not built yet: building it")
    try:
        return helm.build()
    except helm.HelmError as error:
        raise helm.HelmError(
            f"{error}; `make helm` builds Helm, or run with --decider kube-scheduler (no webhook)"
        ) from None


async def serve(
    nodes: list[SimNode],
    *,
    stop: asyncio.Event,
    out: Callable[[str], None],
    kubeconfig: Path | None = None,
    keep: bool = False,
    decider: Decider = "tangram",
    release: Release = NEWEST,
) -> int:
    """Bring everything up, report `Running`, serve until `stop`, then stop all of it (and remove
    the work folder unless `keep`)."""
    helm_path = await asyncio.to_thread(helm_binary, out) if decider == "tangram" else None
    cluster = LocalCluster(nodes)
    try:
        plane = ControlPlane(data_dir=cluster.workdir / "controlplane", release=release)
        return await _serve_plane(
            cluster, plane, stop=stop, out=out, kubeconfig=kubeconfig, decider=decider, helm_path=helm_path
        )
    finally:
        if keep:
            out(f"tangram cluster: work folder kept: {cluster.workdir}")
        else:
            shutil.rmtree(cluster.workdir, ignore_errors=True)
        out("tangram cluster: stopped")


async def _serve_plane(
    cluster: LocalCluster,
    plane: ControlPlane,
    *,
    stop: asyncio.Event,
    out: Callable[[str], None],
    kubeconfig: Path | None,
    decider: Decider,
    helm_path: Path | None,
) -> int:
    out(
        f"tangram cluster: starting the Kubernetes {plane.release.version} control plane in {cluster.workdir}"
    )
    await asyncio.to_thread(plane.start)
    try:
        api = await plane.client()
        try:
            for node in cluster.nodes:
                await register_node(api, node.name)
            await install_device_classes(api)
            cluster.kubeconfig = plane.kubeconfig
            if decider == "tangram":
                await call(
                    f"create Namespace {NAMESPACE}",
                    CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}}),
                )
                cluster.decide_in_kubernetes = True
                cluster.allocator_args = ("--kubernetes-namespace", NAMESPACE)
            cluster.start()
            webhook: admission.WebhookProcess | None = None
            try:
                if decider == "tangram":
                    webhook = await start_webhook(api, cluster, plane, helm_path)
                    await until_deciding(api)
                return await _serve_nodes(
                    api, cluster, plane, stop=stop, out=out, kubeconfig=kubeconfig, webhook=webhook
                )
            finally:
                codes = {"admission": webhook.stop()} if webhook is not None else {}
                codes.update(cluster.stop())
                failed = {name: code for name, code in codes.items() if code != 0}
                if failed:
                    out(f"tangram cluster: services that did not stop cleanly: {failed}")
        finally:
            await api.close()
    finally:
        await asyncio.to_thread(plane.stop)


async def start_webhook(
    api: Any, cluster: LocalCluster, plane: ControlPlane, helm_path: Path | None
) -> admission.WebhookProcess:
    """The chart's admission webhook for this cluster's Kubernetes version, serving and ready."""
    hook = await admission.install(
        plane,
        api,
        namespace=NAMESPACE,
        kubeconfig=cluster.workdir / "admission" / "kubeconfig",
        log=cluster.workdir / "logs" / "admission.log",
        kube_version=f"{plane.release.minor}.0",
        token_s=WEBHOOK_TOKEN_S,
        binary=helm_path,
    )
    webhook = hook.start("--log-level=info")
    try:
        await admission.wait_ready(webhook, WAIT_S)
    except BaseException:
        webhook.stop()
        raise
    return webhook


async def until_deciding(api: Any) -> None:
    """Until Tangram decides what is applied next: the API server sends pods to the webhook, and
    an allocator leads (it keeps the Lease `tangram-allocator`)."""
    await admission.wait_called(api, "default", WAIT_S)
    coordination = CoordinationV1Api(api)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        try:
            lease = await call(
                f"read Lease {NAMESPACE}/{ALLOCATOR_LEASE}",
                coordination.read_namespaced_lease(ALLOCATOR_LEASE, NAMESPACE),
            )
            if lease.spec.holder_identity:
                return
        except KubeApiError as error:
            if not error.not_found:
                raise
        if loop.time() > deadline:
            raise RuntimeError(
                f"no allocator took the Lease {NAMESPACE}/{ALLOCATOR_LEASE} within {WAIT_S:g} s"
            )
        await asyncio.sleep(0.2)


async def _watch(webhook: admission.WebhookProcess, stop: asyncio.Event) -> None:
    """Until `stop`; WebhookError as soon as the webhook exits on its own."""
    while not stop.is_set():
        if webhook.process.poll() is not None:
            raise admission.WebhookError(
                f"the admission webhook exited {webhook.process.returncode}; its log: {webhook.log}"
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def _shown(path: Path) -> str:
    """A path as a person types it here: relative to the working directory when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def hints(running: Running, cluster: LocalCluster) -> list[str]:
    """What to try next, printed under the ready line."""
    examples = helm.repository_root() / "deploy" / "examples"
    mig, tp4 = _shown(examples / "mig-1g.yaml"), _shown(examples / "tensor-parallel-4gpu.yaml")
    lines = [
        f"  export KUBECONFIG={running.kubeconfig}",
        f"  kubectl apply -f {mig} -f {tp4}",
        "  kubectl get pods,resourceclaims -o wide",
    ]
    if running.decider == "tangram":
        lines += [
            "  kubectl get resourceclaims -o yaml --show-managed-fields  # allocation: tangram-allocator",
            "  kubectl describe pod <pod>  # a claim that cannot be placed: TangramUnschedulable",
        ]
    else:
        lines.append("  kubectl get resourceclaims -o yaml   # status.allocation by kube-scheduler")
    lines.append(f"  tangram explain default/<claim> --nats-url {running.nats}")
    for node in cluster.nodes:
        state = cluster.state_file(node.name)
        lines.append(f"  tangram mig show --sim {node.machine} --state-file {state} --node {node.name}")
    lines.append(f"  service logs: {cluster.workdir / 'logs'}; Ctrl-C stops everything")
    return lines


async def _serve_nodes(
    api: Any,
    cluster: LocalCluster,
    plane: ControlPlane,
    *,
    stop: asyncio.Event,
    out: Callable[[str], None],
    kubeconfig: Path | None,
    webhook: admission.WebhookProcess | None,
) -> int:
    written = kubeconfig or cluster.workdir / "kubeconfig"
    if kubeconfig is not None:
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    if written != plane.kubeconfig:
        shutil.copyfile(plane.kubeconfig, written)
        written.chmod(0o600)
    kubelets = [
        NodeKubelet(api, node=node.name, dra_socket=cluster.dra_socket(node.name)) for node in cluster.nodes
    ]
    tasks = [asyncio.create_task(k.run(stop), name=f"kubelet-{k.node}") for k in kubelets]
    if webhook is not None:
        tasks.append(asyncio.create_task(_watch(webhook, stop), name="admission"))
    try:
        running = Running(
            kubeconfig=written,
            server=plane.server,
            nodes=[node.name for node in cluster.nodes],
            workdir=cluster.workdir,
            decider="tangram" if webhook is not None else "kube-scheduler",
            kubernetes=plane.release.version,
            nats=cluster.url,
        )
        out(running.line())
        for line in hints(running, cluster):
            out(line)
        try:
            await first(stop.wait(), tasks)
        except admission.WebhookError as error:
            out(f"tangram cluster: {error}")
            return 1
        dead = cluster.dead()
        if dead:
            out("tangram cluster: services exited: " + "; ".join(dead))
            return 1
        return 0
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await settle(tasks)
