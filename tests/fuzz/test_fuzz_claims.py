"""The claim path over hostile input: ResourceClaim specs, TopologyConfig parameters, CEL selectors.

The documented outcomes: a spec parses or raises ValueError naming the field; the allocator
answers every claim with a decision (a failure carries the reason), never an exception; a selector
compiles or raises CelCompileError, and evaluates to a bool or raises CelRuntimeError.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.allocation import Allocated, Claim, DeviceClass, Failed, FleetState
from tangram.allocation.spec import parse_claim_spec
from tangram.cel import CelCompileError, CelRuntimeError, compile_selector
from tangram.dra.config import parse_topology_config
from tangram.dra.model import Device
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tests.allocator.helpers import hardware
from tests.cel.devices import h100, mig_3g

from .strategies import FUZZ, TIMEOUT_S, hostile_values, json_values, text

pytestmark = pytest.mark.timeout(TIMEOUT_S)

CLASSES = {c.name: c for c in (DeviceClass.from_manifest(m) for m in load_shipped_device_classes())}
ATTRIBUTE = 'device.attributes["gpu.tangram.dev"]'

# Pieces of the DRA CEL language, so that generated selectors get past the parser often.
cel_atoms = st.sampled_from(
    [
        f"{ATTRIBUTE}.profile",
        f"{ATTRIBUTE}.type",
        f"{ATTRIBUTE}.index",
        'device.capacity["gpu.tangram.dev"].memory',
        f'{ATTRIBUTE}.driverVersion.isGreaterThan(semver("1.0.0"))',
        'quantity("1Gi")',
        "device.driver",
        '"3g.71gb"',
        "1",
        "2.5",
        "true",
        "null",
        "[1, 2]",
        '{"a": 1}',
        "size(device.driver)",
        'device.attributes["nope"].x',
    ]
)
cel_operators = st.sampled_from(
    [
        " == ",
        " != ",
        " && ",
        " || ",
        " < ",
        " + ",
        " * ",
        " / ",
        " % ",
        " in ",
        ".",
        "(",
        ")",
        "[",
        "]",
        "!",
        "?",
        ":",
    ]
)
cel_expressions = (
    st.lists(cel_atoms | cel_operators | text, min_size=1, max_size=12).map("".join)
    | st.integers(1, 5000).map(lambda n: "(" * n + "true" + ")" * n)
    | st.integers(1, 5000).map(lambda n: "!" * n + "true")
    | st.integers(1, 2000).map(lambda n: " && ".join(["true"] * n))
    | text
)


@cache
def fleet() -> FleetState:
    state = FleetState()
    state.apply_inventory(hardware("hgx-h200", "n1"))
    return state


@cache
def devices() -> list[Device]:
    return [h100(), mig_3g()]


def selection() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"deviceClassName": st.sampled_from([*CLASSES, "", "nope"]) | text},
        optional={
            "count": st.integers(-3, 40) | hostile_values,
            "allocationMode": st.sampled_from(["ExactCount", "All", "Some"]) | hostile_values,
            "selectors": st.lists(
                st.fixed_dictionaries({"cel": st.fixed_dictionaries({"expression": cel_expressions})}),
                max_size=3,
            )
            | hostile_values,
            "capacity": st.fixed_dictionaries(
                {
                    "requests": st.dictionaries(
                        text,
                        st.sampled_from(["1Gi", "80Gi", "-1", "1e999", "x"]) | hostile_values,
                        max_size=2,
                    )
                }
            ),
            "tolerations": hostile_values,
        },
    )


topology_parameters = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.just("gpu.tangram.dev/v1alpha1") | hostile_values,
        "kind": st.just("TopologyConfig") | hostile_values,
        "interconnect": st.sampled_from(["NVLink", "Any", "nvlink"]) | hostile_values,
        "minPairBandwidthGBps": st.floats() | hostile_values,
        "placement": st.sampled_from(["Pack", "Spread"]) | hostile_values,
    },
) | st.dictionaries(text, json_values, max_size=5)

requests = st.fixed_dictionaries(
    {"name": st.sampled_from(["gpus", "mig", "g"]) | text},
    optional={
        "exactly": selection(),
        "firstAvailable": st.lists(selection().map(lambda s: {**s, "name": "a"}), max_size=3)
        | hostile_values,
    },
)

specs = (
    st.fixed_dictionaries(
        {
            "devices": st.fixed_dictionaries(
                {},
                optional={
                    "requests": st.lists(requests, max_size=3) | hostile_values,
                    "constraints": st.lists(
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "requests": st.lists(st.sampled_from(["gpus", "mig", "x"]), max_size=2),
                                "matchAttribute": st.sampled_from(["gpu.tangram.dev/nvlinkDomain", "x"])
                                | text,
                                "distinctAttribute": text,
                            },
                        ),
                        max_size=2,
                    )
                    | hostile_values,
                    "config": st.lists(
                        st.fixed_dictionaries(
                            {
                                "opaque": st.fixed_dictionaries(
                                    {
                                        "driver": st.just("gpu.tangram.dev") | text,
                                        "parameters": topology_parameters,
                                    }
                                )
                            },
                            optional={"requests": st.lists(st.sampled_from(["gpus", "mig"]), max_size=2)},
                        ),
                        max_size=2,
                    )
                    | hostile_values,
                },
            )
        }
    )
    | hostile_values
)


@FUZZ
@given(spec=specs)
def test_a_claim_spec_parses_or_names_its_problem(spec: Any) -> None:
    try:
        parse_claim_spec(spec)
    except ValueError as error:
        assert str(error)


@FUZZ
@given(spec=specs, uid=st.sampled_from(["c-1", "../../etc/x", "A" * 300]) | text)
def test_the_allocator_answers_every_claim_with_a_decision(spec: Any, uid: str) -> None:
    state = fleet()
    claim = Claim(namespace="fuzz", name="c", uid=uid, spec=spec)
    decision = state.allocate(claim, CLASSES, "tangram")
    assert isinstance(decision, Allocated | Failed)
    if isinstance(decision, Failed):
        assert decision.reason
    else:
        state.release(uid)


@FUZZ
@given(parameters=topology_parameters)
def test_topology_parameters_parse_or_name_their_problem(parameters: Any) -> None:
    try:
        parse_topology_config(parameters, "spec.devices.config[0].opaque.parameters")
    except ValueError as error:
        assert "spec.devices.config[0].opaque.parameters" in str(error)


@FUZZ
@given(expression=cel_expressions)
def test_a_selector_compiles_and_evaluates_or_says_why(expression: str) -> None:
    try:
        selector = compile_selector(expression)
    except CelCompileError as error:
        assert str(error)
        return
    for device in devices():
        try:
            assert isinstance(selector.matches(device), bool)
        except CelRuntimeError as error:
            assert str(error)
