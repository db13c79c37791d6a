"""`tangram cluster up` as a person runs it: a process that serves until SIGTERM, with a kubeconfig
through which an example from deploy/examples is applied and its pod runs with its claim allocated."""

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
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.kubernetes.api import connect
from tangram.local.clusterup import READY

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

ROOT = Path(__file__).resolve().parents[2]
START_S = 300.0  # the control plane and every service on a loaded 2-core machine
WAIT_S = 120


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
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tangram.cli",
        "cluster",
        "up",
        "--node",
        "gpu-node=dgx-h100",
        "--kubeconfig",
        str(kubeconfig),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        ready = await read_ready(process)
        assert ready["kubeconfig"] == str(kubeconfig) and ready["nodes"] == ["gpu-node"]
        api = await connect(kubeconfig=kubeconfig)
        try:
            core, resource = CoreV1Api(api), ResourceV1Api(api)
            documents = list(yaml.safe_load_all((ROOT / "deploy/examples/mig-1g.yaml").read_text()))
            [claim_template] = [d for d in documents if d["kind"] == "ResourceClaimTemplate"]
            [pod] = [d for d in documents if d["kind"] == "Pod"]
            await resource.create_namespaced_resource_claim_template("default", claim_template)
            await core.create_namespaced_pod("default", pod)
            name = pod["metadata"]["name"]
            running = await running_pod(core, name)
            assert running.spec.node_name == "gpu-node"
            [status] = running.status.resource_claim_statuses
            claim = await resource.read_namespaced_resource_claim(status.resource_claim_name, "default")
            [result] = claim.status.allocation.devices.results
            assert result.driver == "gpu.tangram.dev" and result.pool == "gpu-node"
            assert "-mig-1g-10gb-" in result.device
        finally:
            await api.close()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        output = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, output[0].decode(errors="replace")[-3000:]
    assert b"tangram cluster: stopped" in output[0]
