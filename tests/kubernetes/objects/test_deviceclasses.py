import os
from pathlib import Path
from typing import Any

import cel
import pytest

from tangram.dra import node_devices
from tangram.kubernetes.objects import load_shipped_device_classes, render_slices
from tangram.kubernetes.objects.deviceclasses import shipped_manifest_paths
from tests.kubernetes.objects.nodes import h100_node
from tests.kubernetes.objects.schema import validate_strictly
from tests.support.driver import DRIVER

REPO = Path(__file__).resolve().parents[3]


def test_shipped_classes_are_the_three_tangram_classes() -> None:
    classes = load_shipped_device_classes()
    assert [c["metadata"]["name"] for c in classes] == [
        "gpu.tangram.dev",
        "mig.gpu.tangram.dev",
        "shared.gpu.tangram.dev",
    ]
    assert {c["apiVersion"] for c in classes} == {"resource.k8s.io/v1"}


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_shipped_classes_validate_strictly(version: str) -> None:
    for obj in load_shipped_device_classes():
        validate_strictly(obj, version)


def test_deploy_folder_links_to_the_package_copies() -> None:
    folder = REPO / "deploy" / "deviceclasses"
    deployed = sorted(p for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    assert [p.name for p in deployed] == [p.name for p in shipped_manifest_paths()]
    for link, source in zip(deployed, shipped_manifest_paths(), strict=True):
        assert link.is_symlink()
        assert link.resolve() == source.resolve()
        assert os.readlink(link) == f"../../libs/tangram/kubernetes/objects/deviceclasses/{source.name}"


def _cel_device(device: dict[str, Any]) -> dict[str, Any]:
    """A rendered device as DRA's CEL sees it: attributes grouped by domain, own domain implied."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device["attributes"].items():
        domain, _, local = name.rpartition("/")
        [plain] = value.values()
        attributes.setdefault(domain or DRIVER, {})[local] = plain
    return {"driver": DRIVER, "attributes": attributes}


@pytest.mark.parametrize(
    ("class_name", "expected_kind"),
    [("gpu.tangram.dev", "gpu"), ("mig.gpu.tangram.dev", "mig"), ("shared.gpu.tangram.dev", "shared")],
)
def test_class_selectors_pick_exactly_their_kind(class_name: str, expected_kind: str) -> None:
    [device_class] = [c for c in load_shipped_device_classes() if c["metadata"]["name"] == class_name]
    slices = render_slices(node_devices(h100_node(), shared=True), k8s_version="1.37", driver=DRIVER)
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    expressions = [sel["cel"]["expression"] for sel in device_class["spec"]["selectors"]]
    selected = {
        d["name"]
        for d in devices
        if all(cel.evaluate(e, {"device": _cel_device(d)}) is True for e in expressions)
    }
    if expected_kind == "gpu":
        assert selected == {f"gpu-{i}" for i in range(8)}
    elif expected_kind == "shared":
        # per GPU: itself, and 17 placements (no media extensions, smaller than the GPU)
        assert len(selected) == 8 * 18
        assert all(n.endswith("-shared") for n in selected)
    else:
        assert len(selected) == 8 * 25
        assert all("-mig-" in n for n in selected)
    chosen = next(d for d in devices if d["name"] in selected)
    other = {**_cel_device(chosen), "driver": "gpu.nvidia.com"}
    assert not all(cel.evaluate(e, {"device": other}) is True for e in expressions)
