"""The examples in deploy/examples ask for what their comments say, and the simulated fleet of
a simulated node can satisfy each one (claims and templates decided by the allocator offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tangram.allocation import Allocated, Claim, DeviceClass, FleetState
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tests.allocator.helpers import hardware

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
CLASSES = {c.name: c for c in (DeviceClass.from_manifest(m) for m in load_shipped_device_classes())}


def claim_specs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document["kind"] == "ResourceClaim":
                found.append((f"{path.name}:{document['metadata']['name']}", document["spec"]))
            elif document["kind"] == "ResourceClaimTemplate":
                found.append((f"{path.name}:{document['metadata']['name']}", document["spec"]["spec"]))
    return found


def fleet(*machines: str) -> FleetState:
    state = FleetState()
    for index, machine in enumerate(machines):
        state.apply_inventory(hardware(machine, f"node-{index}"))
    return state


@pytest.mark.parametrize(("name", "spec"), claim_specs(), ids=[name for name, _ in claim_specs()])
def test_each_example_claim_is_satisfiable_on_a_simulated_hgx_h200(name: str, spec: dict[str, Any]) -> None:
    decision = fleet("hgx-h200").allocate(
        Claim(namespace="default", name=name, uid="u-1", spec=spec), CLASSES
    )
    assert isinstance(decision, Allocated), decision


def test_the_examples_cover_what_they_are_named_for() -> None:
    decided = {}
    for name, spec in claim_specs():
        decision = fleet("hgx-h200").allocate(
            Claim(namespace="default", name=name, uid="u", spec=spec), CLASSES
        )
        assert isinstance(decision, Allocated)
        decided[name] = decision
    [mig] = decided["mig-1g.yaml:mig-1g"].devices
    assert mig.profile == "1g.18gb" and mig.placement is not None and mig.placement.size == 1
    tp4 = decided["tensor-parallel-4gpu.yaml:tp4"].devices
    assert len({d.gpu_index for d in tp4}) == 4 and all(d.profile is None for d in tp4)
    assert (
        decided["shared-template-deployment.yaml:rerankers".replace("rerankers", "mig-2g")].devices[0].profile
        == "2g.35gb"
    )


def test_first_available_falls_back_from_h200_to_h100() -> None:
    [(_, spec)] = [(n, s) for n, s in claim_specs() if n.startswith("first-available")]
    on_h200 = fleet("hgx-h200", "dgx-h100").allocate(
        Claim(namespace="d", name="x", uid="a", spec=spec), CLASSES
    )
    on_h100 = fleet("dgx-h100").allocate(Claim(namespace="d", name="x", uid="b", spec=spec), CLASSES)
    assert isinstance(on_h200, Allocated) and isinstance(on_h100, Allocated)
    assert [d.request for d in on_h200.devices] == ["gpu/h200"]
    assert [d.request for d in on_h100.devices] == ["gpu/h100"]


def test_four_shared_embedders_fit_on_one_l40s() -> None:
    [(_, spec)] = [(n, s) for n, s in claim_specs() if n.startswith("shared-embedders")]
    state = fleet("l40s-8")
    decisions = [
        state.allocate(Claim(namespace="default", name=f"e{i}", uid=f"u-{i}", spec=spec), CLASSES)
        for i in range(4)
    ]
    assert all(isinstance(d, Allocated) for d in decisions)
    devices = [d.devices[0] for d in decisions if isinstance(d, Allocated)]
    assert {d.device for d in devices} == {"gpu-0-shared"}
    assert all(d.share is not None and d.share.compute_percent == 25 for d in devices)
    assert all(d.share is not None and d.share.memory_bytes == 10 * 2**30 for d in devices)
