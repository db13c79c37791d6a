"""The one rule for which DeviceClasses and claims are Tangram's (tangram.kubernetes.objects.classes), and the
scheduling gate's patches (tangram.kubernetes.objects.gates)."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.kubernetes.objects import load_shipped_device_classes
from tangram.kubernetes.objects.classes import (
    is_tangram_claim,
    is_tangram_class,
    requested_class_names,
    requires_driver,
)
from tangram.kubernetes.objects.gates import add_gate_patch, holds_gate, remove_gate_patch
from tangram.kubernetes.objects.names import SCHEDULING_GATE


def device_class(*expressions: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "x"},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


def test_the_shipped_classes_are_tangrams() -> None:
    shipped = load_shipped_device_classes()
    assert len(shipped) == 3
    assert all(is_tangram_class(c) for c in shipped)


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "gpu.tangram.dev"',
        '"gpu.tangram.dev" == device.driver',
        "device.driver == 'gpu.tangram.dev'",
        'device.attributes["gpu.tangram.dev"].type == "mig" && device.driver == "gpu.tangram.dev"',
        '(device.driver == "gpu.tangram.dev" && true) && device.capacity["gpu.tangram.dev"].memory '
        '>= quantity("10Gi")',
    ],
)
def test_a_top_level_conjunct_on_the_driver_makes_a_class_tangrams(expression: str) -> None:
    assert requires_driver(expression)
    assert is_tangram_class(device_class(expression))
    # a second selector ANDs with the first: still only Tangram's devices
    assert is_tangram_class(device_class("true", expression))


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "gpu.nvidia.com"',
        'device.driver != "gpu.tangram.dev"',
        'device.driver == "gpu.tangram.dev" || device.driver == "gpu.nvidia.com"',
        '!(device.driver == "gpu.tangram.dev")',
        'true ? device.driver == "gpu.tangram.dev" : true',
        'device.driver.startsWith("gpu.tangram.dev")',
        'device.attributes["gpu.tangram.dev"].type == "gpu"',  # any driver may publish this domain
        'other.driver == "gpu.tangram.dev"',
        'device.driver == "gpu.tangram.dev',  # does not parse
        "",
    ],
)
def test_anything_else_is_not(expression: str) -> None:
    assert not requires_driver(expression)
    assert not is_tangram_class(device_class(expression))


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"spec": None},
        {"spec": {"selectors": "x"}},
        {"spec": {"selectors": [None, {"cel": None}, {"cel": {"expression": 3}}]}},
        {"spec": {}},
        [],
    ],
)
def test_malformed_classes_are_not_tangrams(obj: Any) -> None:
    assert not is_tangram_class(obj)


def request(cls: str, name: str = "r") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls}}


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


TANGRAM = {"gpu.tangram.dev", "mig.gpu.tangram.dev", "my-mig"}


def ours(name: str) -> bool:
    return name in TANGRAM


def test_claims_are_tangrams_when_every_request_and_alternative_names_a_tangram_class() -> None:
    assert is_tangram_claim(spec(request("mig.gpu.tangram.dev")), ours)
    assert is_tangram_claim(spec(request("gpu.tangram.dev"), request("my-mig", "b")), ours)
    alternatives = {
        "name": "r",
        "firstAvailable": [
            {"name": "a", "deviceClassName": "my-mig"},
            {"name": "b", "deviceClassName": "gpu.tangram.dev"},
        ],
    }
    assert is_tangram_claim(spec(alternatives), ours)
    assert requested_class_names(spec(alternatives)) == ["my-mig", "gpu.tangram.dev"]


def test_mixed_foreign_empty_and_malformed_claims_are_not() -> None:
    assert not is_tangram_claim(spec(request("gpu.tangram.dev"), request("gpu.nvidia.com", "b")), ours)
    assert not is_tangram_claim(spec(request("gpu.nvidia.com")), ours)
    mixed_alternatives = {
        "name": "r",
        "firstAvailable": [
            {"name": "a", "deviceClassName": "my-mig"},
            {"name": "b", "deviceClassName": "other"},
        ],
    }
    assert not is_tangram_claim(spec(mixed_alternatives), ours)
    assert not is_tangram_claim(spec(), ours)
    assert not is_tangram_claim({}, ours)
    assert not is_tangram_claim({"devices": {"requests": [{"name": "r"}]}}, ours)
    assert not is_tangram_claim({"devices": {"requests": [{"name": "r", "exactly": {}}]}}, ours)
    assert not is_tangram_claim({"devices": {"requests": [{"name": "r", "firstAvailable": []}]}}, ours)
    assert not is_tangram_claim({"devices": {"requests": "x"}}, ours)


# --- the scheduling gate -----------------------------------------------------------------------


def test_the_gate_is_added_once_and_lifted_without_touching_other_gates() -> None:
    bare: dict[str, Any] = {"spec": {}}
    assert not holds_gate(bare) and remove_gate_patch(bare) is None
    assert add_gate_patch(bare) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": SCHEDULING_GATE}]}
    ]
    assert add_gate_patch({"spec": {"nodeName": "n1"}}) is None
    gated = {"spec": {"schedulingGates": [{"name": "example.com/x"}, {"name": SCHEDULING_GATE}]}}
    assert holds_gate(gated) and add_gate_patch(gated) is None
    assert remove_gate_patch(gated) == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    other = {"spec": {"schedulingGates": [{"name": "example.com/x"}]}}
    assert add_gate_patch(other) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": SCHEDULING_GATE}}
    ]
    assert remove_gate_patch(other) is None
    assert not holds_gate({"spec": {"schedulingGates": "x"}}) and add_gate_patch({}) is None
