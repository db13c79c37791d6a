"""`tangram cluster up` as a person runs it: a process that serves until SIGTERM, with a kubeconfig
through which an example from deploy/examples is applied and its pod runs with its claim allocated.

On each Kubernetes release built, Tangram decides as the Helm chart runs it: the chart's admission
webhook gates the examples' pods, the allocator writes their claims' allocations (its field manager
owns `status.allocation`, and its ledger holds them) and lifts the gates, the node prepares them
(the pods run, the MIG instance is made on the simulated GPU), and deleting the pods frees it all;
a claim that cannot be placed gets a Warning Event and its pod waits, gated."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api, VersionApi

from tangram.dra.names import mig_device_name
from tangram.kubernetes.api import connect
from tangram.kubernetes.objects.claimbridge import UNSCHEDULABLE_REASON
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.clusterup import READY
from tangram.local.controlplane import Release
from tangram.partitioning import MigExecutor
from tests.e2e.kubecluster import allocator_state_at, logged_health_port
from tests.partitioner.helpers import MINORS, sim
from tests.support.polling import until

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

ROOT = Path(__file__).resolve().parents[2]
START_S = 300.0  # the control plane and every service on a loaded 2-core machine
WAIT_S = 120


async def cluster_up(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tangram.cli",
        "cluster",
        "up",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def read_ready(process: asyncio.subprocess.Process) -> dict[str, Any]:
    assert process.stdout is not None
    seen: list[str] = []
    while True:
        raw = await asyncio.wait_for(process.stdout.readline(), START_S)
        if not raw:
            raise AssertionError("tangram cluster up exited before it was ready:\n" + "\n".join(seen))
        line = raw.decode().rstrip()
        seen.append(line)
        if line.startswith(READY):
            parsed: dict[str, Any] = json.loads(line[len(READY) :])
            return parsed


async def stopped(process: asyncio.subprocess.Process) -> str:
    """SIGTERM to `tangram cluster up` (unless it ended), its exit awaited: it must be 0; its output."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    output = await asyncio.wait_for(process.communicate(), 120)
    text = output[0].decode(errors="replace")
    assert process.returncode == 0, text[-3000:]
    return text


async def running_pod(core: CoreV1Api, name: str) -> Any:
    """The pod once Running, read until WAIT_S has passed (a watch can end early on a loaded
    machine); otherwise fail with its conditions and the namespace's events."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while loop.time() < deadline:
        found = await core.read_namespaced_pod(name, "default")
        if found.status.phase == "Running":
            return found
        await asyncio.sleep(0.5)
    conditions = [f"{c.type}={c.status}: {c.reason} {c.message}" for c in found.status.conditions or []]
    events = await core.list_namespaced_event("default")
    seen = [f"{e.involved_object.name}: {e.reason}: {e.message}" for e in events.items]
    raise AssertionError(f"pod {name} not Running within {WAIT_S} s: {conditions} {seen}")


async def test_cluster_up_runs_an_example_pod_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    # today's behaviour, without the gate: kube-scheduler allocates, Tangram's nodes prepare
    process = await cluster_up(
        "--node", "gpu-node=dgx-h100", "--kubeconfig", str(kubeconfig), "--decider", "kube-scheduler"
    )
    try:
        ready = await read_ready(process)
        assert ready["kubeconfig"] == str(kubeconfig) and ready["nodes"] == ["gpu-node"]
        assert ready["decider"] == "kube-scheduler"
        api = await connect(kubeconfig=kubeconfig)
        try:
            core, resource = CoreV1Api(api), ResourceV1Api(api)
            documents = list(yaml.safe_load_all((ROOT / "deploy/examples/mig-1g.yaml").read_text()))
            [claim_template] = [d for d in documents if d["kind"] == "ResourceClaimTemplate"]
            [pod] = [d for d in documents if d["kind"] == "Pod"]
            await resource.create_namespaced_resource_claim_template("default", claim_template)
            created = await core.create_namespaced_pod("default", pod)
            assert not created.spec.scheduling_gates
            name = pod["metadata"]["name"]
            running = await running_pod(core, name)
            assert running.spec.node_name == "gpu-node"
            [status] = running.status.resource_claim_statuses
            claim = await resource.read_namespaced_resource_claim(status.resource_claim_name, "default")
            [result] = claim.status.allocation.devices.results
            assert result.driver == "gpu.tangram.dev" and result.pool == "gpu-node"
            assert "-mig-1g-10gb-" in result.device
            assert allocation_managers(claim) and ALLOCATOR not in allocation_managers(claim)
        finally:
            await api.close()
    finally:
        text = await stopped(process)
    assert "tangram cluster: stopped" in text


MACHINE = "dgx-h100"
NODE = "gpu-node"
ALLOCATOR = "tangram-allocator"  # the allocator's field manager and Event component


def example(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ResourceClaimTemplate and the Pod of deploy/examples/`name`."""
    documents = list(yaml.safe_load_all((ROOT / "deploy/examples" / name).read_text()))
    [template] = [d for d in documents if d["kind"] == "ResourceClaimTemplate"]
    [pod] = [d for d in documents if d["kind"] == "Pod"]
    return template, pod


def too_big() -> tuple[dict[str, Any], dict[str, Any]]:
    """Nine whole GPUs: more than the node has."""
    template, pod = example("tensor-parallel-4gpu.yaml")
    template["metadata"]["name"] = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "nine"
    template["spec"]["spec"]["devices"] = {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tangram.dev", "count": 9}}]
    }
    pod["metadata"]["name"] = "too-big"
    return template, pod


def mig_instances(workdir: Path) -> list[Any]:
    """The MIG instances on the node's simulated GPUs, read from their state file."""
    executor = MigExecutor(sim(MACHINE, workdir / NODE / "gpus.json"), minors=MINORS)
    return [instance for gpu in range(8) for instance in executor.observe(gpu)]


def allocation_managers(claim: Any) -> set[str]:
    """The field managers that own the claim's status.allocation."""
    return {
        entry.manager
        for entry in claim.metadata.managed_fields or []
        if "f:allocation" in ((entry.fields_v1 or {}).get("f:status") or {})
    }


async def ledger(workdir: Path) -> dict[str, Any]:
    """The leading allocator's ledger (its /state), at the health port it logged last."""
    return await allocator_state_at(logged_health_port(workdir / "logs" / "allocator.log"))


async def test_cluster_up_tangram_decides_the_examples_on_each_kubernetes(
    release: Release, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = await cluster_up(
        "--k8s-version", release.minor, "--node", f"{NODE}={MACHINE}", "--kubeconfig", str(kubeconfig)
    )
    try:
        ready = await read_ready(process)
        assert (ready["decider"], ready["kubernetes"], ready["nodes"]) == ("tangram", release.version, [NODE])
        workdir = Path(ready["workdir"])
        api = await connect(kubeconfig=kubeconfig)
        try:
            core, resource = CoreV1Api(api), ResourceV1Api(api)
            assert (await VersionApi(api).get_code()).git_version == release.version
            assert mig_instances(workdir) == []  # the machine starts without MIG instances
            pods = {}
            for template, pod in (example("mig-1g.yaml"), example("tensor-parallel-4gpu.yaml"), too_big()):
                await resource.create_namespaced_resource_claim_template("default", template)
                created = await core.create_namespaced_pod("default", pod)
                # the webhook gated it at admission
                assert [g.name for g in created.spec.scheduling_gates or []] == [SCHEDULING_GATE]
                pods[created.metadata.name] = created

            claims = {}
            for name in ("embeddings", "llm-tp4"):
                running = await running_pod(core, name)
                assert running.spec.node_name == NODE and not running.spec.scheduling_gates
                [status] = running.status.resource_claim_statuses
                claims[name] = claim = await resource.read_namespaced_resource_claim(
                    status.resource_claim_name, "default"
                )
                # Tangram's allocator wrote the allocation, not kube-scheduler
                assert allocation_managers(claim) == {ALLOCATOR}
                assert all(r.driver == "gpu.tangram.dev" for r in claim.status.allocation.devices.results)
                assert all(r.pool == NODE for r in claim.status.allocation.devices.results)
            held = (await ledger(workdir))["held"]
            assert {held.get(claim.metadata.uid) for claim in claims.values()} == {NODE}

            [mig] = claims["embeddings"].status.allocation.devices.results
            [instance] = mig_instances(workdir)  # made for the claim, where the allocation says
            assert mig.device == mig_device_name(
                instance.gpu_index, instance.profile, instance.placement.start
            )
            assert instance.profile.startswith("1g.")
            gpus = [r.device for r in claims["llm-tp4"].status.allocation.devices.results]
            assert len(set(gpus)) == 4 and all(g.startswith("gpu-") and "-mig-" not in g for g in gpus)
            assert f"gpu-{instance.gpu_index}" not in gpus

            # nine GPUs cannot be placed: a Warning Event on the pod, which stays gated and Pending
            async def unschedulable() -> list[Any]:
                events = await core.list_namespaced_event("default")
                return [
                    e
                    for e in events.items
                    if e.reason == UNSCHEDULABLE_REASON
                    and e.involved_object.uid == pods["too-big"].metadata.uid
                ]

            [event, *_] = await until("the TangramUnschedulable Event on the pod", unschedulable, WAIT_S)
            assert event.type == "Warning" and event.involved_object.kind == "Pod"
            assert event.source.component == ALLOCATOR
            waiting = await core.read_namespaced_pod("too-big", "default")
            assert waiting.status.phase == "Pending" and waiting.spec.node_name is None
            assert [g.name for g in waiting.spec.scheduling_gates] == [SCHEDULING_GATE]

            # deleted: the node unprepares, the claims go, the ledger frees them, the instance is destroyed
            for name in pods:
                await core.delete_namespaced_pod(name, "default")

            async def released() -> bool:
                left = await resource.list_namespaced_resource_claim("default")
                state = await ledger(workdir)
                return not left.items and not (set(state["held"]) & {c.metadata.uid for c in claims.values()})

            await until("the claims deleted and released", released, WAIT_S)
            await until("the MIG instance destroyed", lambda: mig_instances(workdir) == [], WAIT_S)
            assert process.returncode is None  # nothing crashed
        finally:
            await api.close()
    finally:
        text = await stopped(process)
    assert "tangram cluster: stopped" in text and "did not stop cleanly" not in text
