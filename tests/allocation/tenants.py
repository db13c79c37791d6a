"""Two tenants' claims for the isolation tests (offline and live): a plain trace over a fleet of
five kinds of node, and the hostile claims a tenant can write (selectors that fail while evaluated,
opaque configs that do not parse, counts no node has) with hypothesis strategies drawing them."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from tangram.allocation import Claim
from tangram.events.inventory import NodeHardware
from tests.allocation.machines import (
    DRIVER,
    a100_mig,
    claim,
    h100_nvl,
    hgx,
    l40s,
    nvlink_config,
    profile_is,
    request,
)
from tests.fuzz.strategies import hostile_values, text


def fleet_nodes() -> list[NodeHardware]:
    """NVSwitch, bridged pairs, MIG on Ampere and no NVLink: no node has more than 8 GPUs."""
    return [hgx("hgx-a"), hgx("hgx-b", kind="h200"), h100_nvl("nvl"), a100_mig("a100"), l40s("l40s")]


def whole(i: int, count: int, nvlink: bool = False) -> Claim:
    extra = {"config": nvlink_config("gpus")} if nvlink else {}
    return _plain(i, claim(f"whole-{i}", request(count=count), **extra))


def mig(i: int, profile: str) -> Claim:
    return _plain(
        i, claim(f"mig-{i}", request(device_class="mig.gpu.tangram.dev", selectors=(profile_is(profile),)))
    )


def _plain(i: int, made: Claim) -> Claim:
    return msgspec.structs.replace(made, namespace="plain", uid=f"plain-{i}")


def hostile(i: int, spec: Any) -> Claim:
    return Claim(namespace="tenant", name=f"hostile-{i}", uid=f"hostile-{i}", spec=spec)


def selector_claim(i: int, expression: str, device_class: str = "gpu.tangram.dev") -> Claim:
    return hostile(
        i, {"devices": {"requests": [request(device_class=device_class, selectors=(expression,))]}}
    )


Step = Claim | str  # a claim to decide, or the uid of a claim to release


PLAIN: list[Step] = [
    whole(0, 1),
    mig(1, "1g.10gb"),
    whole(2, 4, nvlink=True),
    mig(3, "3g.40gb"),
    whole(4, 2, nvlink=True),
    "plain-0",
    mig(5, "2g.20gb"),
    whole(6, 1),
    "plain-1",
    whole(7, 8, nvlink=True),
    mig(8, "1g.20gb"),
    whole(9, 2),
]


ATTR = f'device.attributes["{DRIVER}"]'

# Every kind of error the CEL evaluator raises at run time, each from a selector that compiles.
# Most depend on the device, so some devices evaluate and others fail, as a real selector would.
CEL_RUNTIME_ERRORS = {
    "division by zero": f"{ATTR}.index / 0 == 1",
    "modulo by zero": f"{ATTR}.index % 0 == 1",
    "int overflow": f"{ATTR}.index + 9223372036854775807 > 0",
    "int underflow": f"-9223372036854775807 - {ATTR}.index - 2 < 0",
    "multiplication overflow": f"({ATTR}.index + 2) * 9223372036854775807 > 0",
    "uint underflow": f"uint({ATTR}.index) - 9u > 0u",
    "index out of range": f"[1, 2][{ATTR}.index + 5] == 1",
    "negative index": f"[1, 2][-1 - {ATTR}.index] == 1",
    "string to int": f"int({ATTR}.uuid) == 1",
    "int to uint": f"uint(-1 - {ATTR}.index) == 1u",
    "double to int": f"int(1e100 + double({ATTR}.index)) == 1",
    "string to bool": f"bool({ATTR}.uuid)",
    "bad regex": f'{ATTR}.uuid.matches("[")',
    "type mismatch": f"{ATTR}.uuid + 1 == 2",
    "no such overload": f"{ATTR}.uuid[1] == 1",
    "missing attribute": f'{ATTR}["noSuchAttribute"] == 1',
    "missing capacity": f'device.capacity["{DRIVER}"].noSuchCapacity.isInteger()',
    "missing map key": f'{{"a": 1}}[{ATTR}.uuid] == 1',
    "bad quantity": f"quantity({ATTR}.uuid).isInteger()",
    "bad semver": f"semver({ATTR}.uuid).major() == 1",
    "bad timestamp": f'timestamp({ATTR}.uuid) < timestamp("2020-01-01T00:00:00Z")',
    "bad duration": f'duration({ATTR}.uuid) > duration("1s")',
}

HOSTILE_CONFIGS: list[Any] = [
    {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "TopologyConfig", "interconnect": "warp"},
    {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "TopologyConfig", "minPairBandwidthGBps": -1},
    {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "TopologyConfig", "minPairBandwidthGBps": "x"},
    {"apiVersion": "gpu.tangram.dev/v9", "kind": "TopologyConfig", "interconnect": "NVLink"},
    {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "Other"},
    {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "TopologyConfig", "placement": ["Pack"] * 50},
]


hostile_specs: st.SearchStrategy[Any] = st.one_of(
    st.builds(
        lambda expression, device_class: {
            "devices": {"requests": [request(device_class=device_class, selectors=(expression,))]}
        },
        st.sampled_from(sorted(CEL_RUNTIME_ERRORS.values())),
        st.sampled_from(["gpu.tangram.dev", "mig.gpu.tangram.dev", "any.gpu.tangram.dev"]),
    ),
    st.builds(
        lambda config, count: {
            "devices": {
                "requests": [request(count=count)],
                "config": [{"opaque": {"driver": DRIVER, "parameters": config}}],
            }
        },
        st.sampled_from(HOSTILE_CONFIGS) | st.dictionaries(text, hostile_values, min_size=1, max_size=3),
        st.integers(1, 4),
    ),
    st.builds(lambda count: {"devices": {"requests": [request(count=count)]}}, st.integers(9, 10**6)),
    st.builds(lambda name: {"devices": {"requests": [request(device_class=name)]}}, text),
    hostile_values.filter(lambda value: not isinstance(value, dict)),
)
