"""The workload of `tangram bench kubernetes` (pure): the seeded trace of pods, the simulated nodes
it runs on, and the manifests of its pods and their ResourceClaimTemplates."""

from __future__ import annotations

from typing import Any

from tangram import DRIVER_NAME
from tangram.bench.traces import FLEET_MIX, ClaimShape, Op, claim_spec, machine_hardware, saturating_trace
from tangram.events.inventory import NodeHardware, renamed_machine
from tangram.kubernetes.objects.names import SCHEDULING_GATE

MACHINES = ("hgx-h200", "h100-nvl-4x2")  # --nodes N cycles through these
CHURN_LOAD = 0.5  # share of the fleet's GPUs the pods alive ask for while the trace churns
# MIG 1g/2g/3g and whole 1/2/4/8 GPUs (multi-GPU ones on NVLink): the fleet mix without 4g.
KUBE_MIX: tuple[tuple[ClaimShape, float], ...] = tuple(
    (shape, weight) for shape, weight in FLEET_MIX if shape.kind == "gpu" or shape.compute <= 3
)
RUN_LABEL = "bench.tangram.dev/run"


def workload(seed: int, capacity_gpus: float, *, pods: int, saturation: float) -> list[Op]:
    """`pods` arrivals with departures at CHURN_LOAD of the fleet, then arrivals only until the
    pods alive ask for `saturation` times its GPUs: the same for a seed."""
    return saturating_trace(
        seed,
        capacity_gpus,
        churn_claims=pods,
        churn_load=CHURN_LOAD,
        saturation=saturation,
        mix=KUBE_MIX,
    )


def fleet(nodes: int, *, prefix: str = "") -> list[tuple[str, str]]:
    """(node name, machine) for `nodes` nodes, cycling through MACHINES."""
    return [(f"{prefix}{MACHINES[n % len(MACHINES)]}-{n}", MACHINES[n % len(MACHINES)]) for n in range(nodes)]


def node_hardware(nodes: list[tuple[str, str]]) -> list[NodeHardware]:
    """Each node's hardware as its simulated GPUs start: clean copies of the machines (no MIG
    instance, MIG mode off where it can be toggled without a reset), as `clean_machine` writes."""
    templates: dict[str, NodeHardware] = {}
    found = []
    for name, machine in nodes:
        if machine not in templates:
            templates[machine] = machine_hardware(machine)
        found.append(renamed_machine(templates[machine], name))
    return found


def template_name(shape: ClaimShape) -> str:
    return shape.label


def template_spec(shape: ClaimShape, driver: str = DRIVER_NAME) -> dict[str, Any]:
    """The claim spec of a shape (`claim_spec`), multi-GPU ones constrained to one NVLink domain
    as the shipped examples do: kube-scheduler reads the constraint, not the opaque config."""
    spec = claim_spec(shape, driver)
    if shape.nvlink:
        spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": f"{driver}/nvlinkDomain"}]
    return spec


def template_manifest(shape: ClaimShape, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(shape), "namespace": namespace},
        "spec": {"spec": template_spec(shape)},
    }


def pod_name(uid: str) -> str:
    return "pod-" + uid.removeprefix("claim-")


def pod_manifest(name: str, namespace: str, shape: ClaimShape, *, run: str, gated: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {RUN_LABEL: run},
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template_name(shape)}],
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpus"}]},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: run}},
        "spec": spec,
    }
