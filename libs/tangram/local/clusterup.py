"""A local Kubernetes with Tangram: the real control plane, Tangram's services on simulated GPUs,
and a kubelet stand-in per node, until stopped.

The control plane is the one the tests run (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler from the pinned release, `tangram.local.controlplane`). Each simulated node is a
Node object, its discovery publishing ResourceSlices, its partitioner, and its cdi service reading
claims from the API server; the allocator runs as in `tangram demo` and learns what kube-scheduler
allocated from the nodes. The stand-ins prepare the claims of pods bound to their node through the
DRA socket and mark the pods Running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ResourceV1Api

from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.local.controlplane import ControlPlane, register_node
from tangram.local.kubelet import NodeKubelet
from tangram.local.processes import LocalCluster, SimNode
from tangram.service import first, settle

READY = "tangram cluster: ready "


@dataclass(frozen=True)
class Running:
    """What `tangram cluster up` tells a person (and a test) once everything answers."""

    kubeconfig: Path
    server: str
    nodes: list[str]
    workdir: Path

    def line(self) -> str:
        return READY + json.dumps(
            {
                "kubeconfig": str(self.kubeconfig),
                "server": self.server,
                "nodes": self.nodes,
                "workdir": str(self.workdir),
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


async def serve(
    nodes: list[SimNode],
    *,
    stop: asyncio.Event,
    out: Callable[[str], None],
    kubeconfig: Path | None = None,
    keep: bool = False,
) -> int:
    """Bring everything up, report `Running`, serve until `stop`, then stop all of it (and remove
    the work folder unless `keep`)."""
    cluster = LocalCluster(nodes)
    try:
        return await _serve_plane(cluster, stop=stop, out=out, kubeconfig=kubeconfig)
    finally:
        if keep:
            out(f"tangram cluster: work folder kept: {cluster.workdir}")
        else:
            shutil.rmtree(cluster.workdir, ignore_errors=True)
        out("tangram cluster: stopped")


async def _serve_plane(
    cluster: LocalCluster, *, stop: asyncio.Event, out: Callable[[str], None], kubeconfig: Path | None
) -> int:
    plane = ControlPlane(data_dir=cluster.workdir / "controlplane")
    out(f"tangram cluster: starting the control plane in {cluster.workdir}")
    await asyncio.to_thread(plane.start)
    try:
        api = await plane.client()
        try:
            for node in cluster.nodes:
                await register_node(api, node.name)
            await install_device_classes(api)
            cluster.kubeconfig = plane.kubeconfig
            cluster.start()
            try:
                return await _serve_nodes(api, cluster, plane, stop=stop, out=out, kubeconfig=kubeconfig)
            finally:
                codes = cluster.stop()
                failed = {name: code for name, code in codes.items() if code != 0}
                if failed:
                    out(f"tangram cluster: services that did not stop cleanly: {failed}")
        finally:
            await api.close()
    finally:
        await asyncio.to_thread(plane.stop)


async def _serve_nodes(
    api: Any,
    cluster: LocalCluster,
    plane: ControlPlane,
    *,
    stop: asyncio.Event,
    out: Callable[[str], None],
    kubeconfig: Path | None,
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
    try:
        running = Running(
            kubeconfig=written,
            server=plane.server,
            nodes=[node.name for node in cluster.nodes],
            workdir=cluster.workdir,
        )
        out(running.line())
        out(f"  export KUBECONFIG={written}")
        out("  kubectl apply -f deploy/examples/mig-1g.yaml")
        out("  kubectl get resourceclaims,pods -o wide")
        out(f"  service logs: {cluster.workdir / 'logs'}; Ctrl-C stops everything")
        await first(stop.wait(), tasks)
        dead = cluster.dead()
        if dead:
            out("tangram cluster: services exited: " + "; ".join(dead))
            return 1
        return 0
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await settle(tasks)
