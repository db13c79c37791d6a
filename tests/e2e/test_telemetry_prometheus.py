"""Per-pod GPU telemetry proven against a real Prometheus: it scrapes the running Tangram services
of a simulated HGX H200 node and a DCGM exporter stand-in serving the exporter's real metric names
and labels from the same simulated GPUs, evaluates the shipped rules, and answers every dashboard
panel's query.

The known workload: pod "train" holds a whole GPU kept 30% busy, pod "infer" a 1g.18gb MIG
device kept 70% busy. Each pod shows its own device's use, the namespace the sum, and once a pod
is gone its series are gone too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.natsserver import free_port
from tangram.local.processes import logged_health_port
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim import SimNvml
from tests.e2e.kubecluster import (
    MIG_1G,
    Node,
    claim_of,
    gpus_template,
    pod,
    started_node,
    template,
    wait_for_pod,
)
from tests.support.polling import until
from tests.support.prometheus import Prometheus
from tests.support.webview import UiProcess, chromium

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "helm" / "tangram" / "files" / "prometheus" / "tangram.rules.yaml"
DASHBOARD = ROOT / "deploy" / "helm" / "tangram" / "files" / "dashboards" / "tangram.json"
DOCS_SCREENSHOT = ROOT / "docs" / "gpu-use.png"
# Targets that stay empty for this workload: nothing failed, nothing waits.
EMPTY = {
    "sum by (action, nvml_error) (rate(tangram_partition_failures_total[$__rate_interval]))",
    "sum by (consumer) (increase(tangram_bus_dead_letters_total[$__rate_interval]))",
    "max by (cause) (tangram_allocator_waiting_claims) > 0",
}


@contextlib.contextmanager
def dcgm_exporter(node: Node) -> Iterator[int]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tangram.nvml.sim.dcgm",
            "--machine",
            node.machine,
            "--state-file",
            str(node.cluster.state_file(node.name)),
            "--hostname",
            node.name,
            "--port",
            str(port),
        ]
    )
    try:
        yield port
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture
async def scraped(controlplane: Any, kube: Any, unique: str) -> AsyncIterator[tuple[Node, Prometheus]]:
    async with started_node(controlplane, kube, unique, decide=True) as node:
        services = ["allocator", f"discovery@{node.name}", f"partitioner@{node.name}", f"cdi@{node.name}"]

        def logged_ports() -> list[int] | None:
            try:
                return [logged_health_port(node.cluster.service(s).log_path) for s in services]
            except LookupError:
                return None  # a service still starting: the allocator is the slowest to import

        ports: list[int] = await until("every service logging its health port", logged_ports)
        with dcgm_exporter(node) as dcgm:
            prometheus = Prometheus(
                {"tangram": [f"127.0.0.1:{p}" for p in ports], "dcgm": [f"127.0.0.1:{dcgm}"]}, [RULES]
            )
            try:
                await prometheus.ready()

                async def all_up() -> bool:
                    health = await prometheus.targets_up()
                    return len(health) == 5 and set(health.values()) == {"up"}

                await until("every target scraped", all_up, process=prometheus.process)
                yield node, prometheus
            finally:
                prometheus.stop()


async def run_pods(node: Node) -> None:
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("train", ns, 1))
    mig = {
        "name": "mig",
        "exactly": {"deviceClassName": "mig.gpu.tangram.dev", "selectors": [{"cel": {"expression": MIG_1G}}]},
    }
    await node.resource.create_namespaced_resource_claim_template(
        ns, template("infer", ns, {"devices": {"requests": [mig]}})
    )
    # gated as the admission webhook gates them: Tangram decides their claims
    for name, entry in (("train", "gpus"), ("infer", "mig")):
        claims = {entry: {"resourceClaimTemplateName": name}}
        await node.core.create_namespaced_pod(ns, pod(name, ns, None, claims, gates=[SCHEDULING_GATE]))


def by_pod(result: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"]["pod"]: round(float(r["value"][1]), 3) for r in result}


async def test_each_pod_shows_its_own_gpu_use_and_every_panel_answers(
    scraped: tuple[Node, Prometheus],
) -> None:
    node, prometheus = scraped
    ns = node.namespace
    await run_pods(node)
    running = {name: await wait_for_pod(node, name, "Running") for name in ("train", "infer")}
    claims = {
        name: await claim_of(node, running[name], entry)
        for name, entry in (("train", "gpus"), ("infer", "mig"))
    }

    # the info series name each pod's device; checked against the pods' CDI specs and NVML
    async def info() -> dict[str, dict[str, str]] | None:
        found = {
            r["metric"]["pod"]: r["metric"]
            for r in await prometheus.query(f'tangram_claim_device_info{{namespace="{ns}"}}')
        }
        return found if set(found) == {"train", "infer"} else None

    labels = await until("both pods' info series", info)
    nvml = SimNvml.from_machine(node.machine, state_file=node.cluster.state_file(node.name))
    nvml.nvmlInit()
    hardware = read_node_hardware(nvml, node.name)
    whole = next(g for g in hardware.gpus if g.uuid == labels["train"]["gpu_uuid"])
    assert "mig_uuid" not in labels["train"] and whole.uuid in node.spec_text(
        claims["train"]["metadata"]["uid"]
    )
    parent = next(g for g in hardware.gpus if g.uuid == labels["infer"]["gpu_uuid"])
    instance = next(i for i in parent.mig_instances if i.uuid == labels["infer"]["mig_uuid"])
    assert labels["infer"]["gpu_instance_id"] == str(instance.gpu_instance_id)
    assert labels["infer"]["profile"] == "1g.18gb" and instance.uuid in node.spec_text(
        claims["infer"]["metadata"]["uid"]
    )

    # the workload: what each pod's processes keep busy
    nvml.sim_attach_process(whole.index, sm_percent=30, used_mib=4096)
    nvml.sim_attach_process(
        parent.index,
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
        sm_percent=70,
        used_mib=1024,
    )

    async def engine() -> dict[str, float] | None:
        found = by_pod(await prometheus.query(f'pod:tangram_gpu_engine_active:ratio{{namespace="{ns}"}}'))
        return found if found == {"train": 0.3, "infer": 0.7} else None

    await until("each pod's own engine activity", engine)
    assert by_pod(await prometheus.query(f'pod:tangram_gpu_utilization:percent{{namespace="{ns}"}}')) == {
        "train": 30.0
    }
    assert by_pod(await prometheus.query(f'pod:tangram_gpu_memory_used:bytes{{namespace="{ns}"}}')) == {
        "train": 4096 * 2**20,
        "infer": 1024 * 2**20,
    }
    [namespace_sum] = await prometheus.query(f'namespace:tangram_gpu_engine_active:sum{{namespace="{ns}"}}')
    assert float(namespace_sum["value"][1]) == pytest.approx(1.0)
    assert set(by_pod(await prometheus.query(f'pod:tangram_gpu_power:watts{{namespace="{ns}"}}'))) == {
        "train"
    }

    # every panel's query: the telemetry panels name both pods, the others have their series
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            query = expr.replace("$__rate_interval", "1m")
            if expr in EMPTY:
                assert await prometheus.query(query) == [], panel["title"]
                continue
            # scrapes are asynchronous: a rate needs two samples of a target a loaded machine may
            # have answered late once
            result = await until(f"panel {panel['title']!r}: {expr}", lambda q=query: prometheus.query(q))
            if expr.startswith("pod:tangram_gpu_engine_active") or expr.startswith("pod:tangram_gpu_memory"):
                assert {r["metric"].get("pod") for r in result if r["metric"].get("namespace") == ns} == {
                    "train",
                    "infer",
                }
            if "tangram_mig_instances" in expr:
                assert any(r["metric"].get("profile") == "1g.18gb" for r in result), result

    # what a person looks at: `tangram ui --prometheus-url`, pictured by headless Chromium
    async with UiProcess(node.cluster.urls[0], "--prometheus-url", prometheus.url) as ui:
        dom = await asyncio.to_thread(chromium, "--dump-dom", ui.url + "gpu-use")
        assert dom.returncode == 0, dom.stderr[-2000:]
        page = dom.stdout
        for pod_name, busy in (("train", "30%"), ("infer", "70%")):
            row = page.split(f'<tr data-pod="{ns}/{pod_name}">', 1)[1].split("</tr>", 1)[0]
            assert busy in row, row
        assert "1g.18gb" in page and f'<tr data-namespace="{ns}"><td>{ns}</td><td>1.00</td></tr>' in page
        shot = Path(tempfile.mkdtemp(prefix="tgm-shot-")) / "gpu-use.png"
        taken = await asyncio.to_thread(
            chromium, f"--screenshot={shot}", "--window-size=1280,520", ui.url + "gpu-use"
        )
        assert taken.returncode == 0, taken.stderr[-2000:]
    png = shot.read_bytes()
    shutil.rmtree(shot.parent)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    if os.environ.get("TANGRAM_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(png)

    # a pod gone leaves no series behind
    await node.core.delete_namespaced_pod("infer", ns, grace_period_seconds=0)

    async def infer_gone() -> bool:
        found = by_pod(await prometheus.query(f'pod:tangram_gpu_engine_active:ratio{{namespace="{ns}"}}'))
        return set(found) == {"train"}

    await until("the deleted pod's series gone", infer_gone)
