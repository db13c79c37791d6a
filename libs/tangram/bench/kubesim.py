"""What the benchmarks that run in Kubernetes share: a fresh control plane, and Tangram's simulated
nodes registered in it.

`control_plane()` starts the pinned control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) and yields it with a client; `simulated_nodes()` registers Nodes, installs the
shipped DeviceClasses and starts a `LocalCluster` (NATS, the allocator, and discovery, partitioner
and cdi per node, each from a clean machine: no MIG instance), and yields it once every node's
DRA plugin serves and its ResourceSlices are published.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram import DRIVER_NAME
from tangram.hardware import machines
from tangram.kubernetes.api import KubeApiError, call
from tangram.local.clusterup import install_device_classes
from tangram.local.controlplane import ControlPlane, register_node
from tangram.local.processes import LocalCluster, SimNode

READY_WAIT_S = 180.0
T = TypeVar("T")


class BenchError(Exception):
    """The benchmark cannot run or did not finish; the message is one line."""


async def stopped_by_signal(work: Awaitable[T]) -> T:
    """`work`, cancelled on SIGTERM or SIGINT so that everything it started (a control plane runs
    in its own session, out of reach of a signal to this process) is stopped on the way out.
    Raises BenchError naming the signal."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    received: list[str] = []

    def cancel(signum: signal.Signals) -> None:
        received.append(signum.name)
        task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, cancel, signum)
    try:
        return await task
    except asyncio.CancelledError:
        if received:
            raise BenchError(f"stopped by {received[0]}; what the run started is stopped") from None
        raise
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def until(what: str, check: Callable[[], Awaitable[Any]], limit_s: float, every: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; the limit bounds a wait."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        found = await check()
        if found:
            return found
        if loop.time() > deadline:
            raise BenchError(f"{what}: not within {limit_s:g} s")
        await asyncio.sleep(every)


def clean_machine(machine: str, folder: Path) -> Path:
    """A shipped machine's YAML without its MIG instances and MIG mode (Hopper toggles it without
    a reset): every run starts from the same empty GPUs, so a placement over an instance nobody
    asked for (which the node would refuse to make) never mixes into a comparison."""
    data = yaml.safe_load((Path(machines.__file__).parent / f"{machine}.yaml").read_text())
    for gpu in data["gpus"]:
        gpu.pop("mig_instances", None)
        gpu.pop("mig_enabled", None)
    path = folder / f"{machine}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.asynccontextmanager
async def control_plane(*, client_qps: int | None = None) -> AsyncIterator[tuple[ControlPlane, Any]]:
    """A fresh control plane and a cluster-admin client for it; both stopped on the way out.
    `client_qps`: kube-controller-manager's and kube-scheduler's request rate (ControlPlane's)."""
    plane = ControlPlane(client_qps=client_qps)
    starting = asyncio.ensure_future(asyncio.to_thread(plane.start))
    try:
        await asyncio.shield(starting)
        api = await plane.client()
        try:
            yield plane, api
        finally:
            await api.close()
    finally:
        # a start still under way when the run is cancelled finishes first, so that what it
        # started is stopped here
        await asyncio.wait([starting])
        if not starting.cancelled() and starting.exception() is None:
            await asyncio.to_thread(plane.stop)


async def _nodes_ready(api: Any, cluster: LocalCluster, names: Sequence[str]) -> None:
    resource = ResourceV1Api(api)

    async def ready() -> bool:
        dead = cluster.dead()
        if dead:
            raise BenchError("services exited: " + "; ".join(dead))
        if not all(cluster.dra_socket(name).exists() for name in names):
            return False
        slices = await call("list ResourceSlices", resource.list_resource_slice())
        published = {s.spec.node_name for s in slices.items if s.spec.driver == DRIVER_NAME}
        return set(names) <= published

    await until("every node's plugin serving and slices published", ready, READY_WAIT_S, every=0.5)


@contextlib.asynccontextmanager
async def simulated_nodes(
    api: Any,
    kubeconfig: Path,
    nodes: Sequence[tuple[str, str]],
    *,
    allocator_args: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    cleanup: bool = True,
    benchmark: str = "bench",
) -> AsyncIterator[LocalCluster]:
    """(node name, machine) registered as Nodes (with `labels`) and run as Tangram's simulated
    nodes against the control plane of `kubeconfig`; the allocator gets `allocator_args`.

    Yields the running cluster once every node is ready; its services are stopped and its Nodes
    deleted on the way out and, with `cleanup`, its working directory removed. A service that did
    not stop cleanly is said on stderr, prefixed with `tangram bench <benchmark>`."""
    names = [name for name, _ in nodes]
    for name in names:
        await register_node(api, name, labels=dict(labels or {}))
    await install_device_classes(api)
    workdir = Path(tempfile.mkdtemp(prefix="tgm-", dir="/tmp"))
    (workdir / "machines").mkdir()
    files = {machine: clean_machine(machine, workdir / "machines") for machine in {m for _, m in nodes}}
    cluster = LocalCluster(
        [SimNode(name, str(files[machine])) for name, machine in nodes],
        workdir=workdir,
        kubeconfig=kubeconfig,
        allocator_args=tuple(allocator_args),
    )
    cluster.start()
    try:
        await _nodes_ready(api, cluster, names)
        yield cluster
    finally:
        codes = cluster.stop()
        if cleanup:
            shutil.rmtree(cluster.workdir, ignore_errors=True)
        # a Node left with its slices on a shared control plane draws pods nothing prepares
        for name in names:
            with contextlib.suppress(KubeApiError):
                await call(f"delete Node {name}", CoreV1Api(api).delete_node(name))
        failed = {name: code for name, code in codes.items() if code != 0}
        if failed:
            print(f"tangram bench {benchmark}: services that did not stop cleanly: {failed}", file=sys.stderr)
