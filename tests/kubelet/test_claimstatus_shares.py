"""A share read from a claim's allocation: its id, memory and limits, whoever decided it, and
nothing a claim writes can reach another client's limits, paths or environment."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.cdi.devices import ClaimRef
from tangram.dra.sharing import share_id
from tangram.kubelet.claimstatus import ClaimRefused, read_allocation
from tests.support.driver import DRIVER

NODE = "l40s"
CLAIM = ClaimRef(namespace="ml", name="embedder", uid="0b5d0000-0000-4000-8000-000000000002")
SHARE_ID = "5e2a0000-0000-4000-8000-0000000000aa"
GIB = 2**30


def sharing(**parameters: Any) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": ["share"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "SharingConfig", **parameters},
        },
    }


def claim(device: str, config: list[dict[str, Any]] | None = None, **result: Any) -> dict[str, Any]:
    entry = {"request": "share", "driver": DRIVER, "pool": NODE, "device": device, **result}
    return {
        "metadata": {"name": CLAIM.name, "namespace": CLAIM.namespace, "uid": CLAIM.uid},
        "status": {"allocation": {"devices": {"results": [entry], "config": config or []}}},
    }


def test_a_share_carries_the_servers_share_id_consumed_memory_and_the_configs_limits() -> None:
    body = claim(
        "gpu-3-shared",
        [sharing(computePercent=25)],
        shareID=SHARE_ID,
        consumedCapacity={"memory": "10Gi"},
    )
    [result] = read_allocation(body, CLAIM, driver=DRIVER, pool=NODE).results
    assert result.share is not None
    assert (
        result.share.id,
        result.share.strategy,
        result.share.memory_bytes,
        result.share.compute_percent,
    ) == (
        SHARE_ID,
        "MPS",
        10 * GIB,
        25,
    )


def test_where_the_server_dropped_the_share_fields_the_config_and_the_derived_id_stand_in() -> None:
    body = claim("gpu-3-shared", [sharing(strategy="TimeSlicing", memory="6Gi", timeSlice="Short")])
    [result] = read_allocation(body, CLAIM, driver=DRIVER, pool=NODE).results
    assert result.share is not None
    assert result.share.id == share_id(CLAIM.uid, "gpu-3-shared")
    assert (result.share.strategy, result.share.memory_bytes, result.share.time_slice) == (
        "TimeSlicing",
        6 * GIB,
        "Short",
    )
    # nothing given at all: the class's default share
    [plain] = read_allocation(claim("gpu-3-shared"), CLAIM, driver=DRIVER, pool=NODE).results
    assert plain.share is not None and (plain.share.strategy, plain.share.memory_bytes) == ("MPS", 4 * GIB)


def test_an_exclusive_device_has_no_share() -> None:
    [result] = read_allocation(claim("gpu-3"), CLAIM, driver=DRIVER, pool=NODE).results
    assert result.share is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (claim("gpu-3", shareID=SHARE_ID), r"results\[0\]\.shareID is set, but gpu-3 is not a shared device"),
        (
            claim("gpu-3-shared", shareID="../../other"),
            r"results\[0\]\.shareID: '\.\./\.\./other' is not a UUID",
        ),
        (
            claim("gpu-3-shared", consumedCapacity={"memory": "lots"}),
            r"results\[0\]\.consumedCapacity\.memory: quantity 'lots' is not a Kubernetes quantity",
        ),
        # a share's config cannot name another client's limits, a path, or environment
        (
            claim("gpu-3-shared", [sharing(env={"CUDA_MPS_PIPE_DIRECTORY": "/"})]),
            r"invalid SharingConfig: .*parameters\.env: Extra inputs are not permitted",
        ),
        (
            claim("gpu-3-shared", [sharing(pipeDirectory="/var/run/tangram/mps/GPU-other")]),
            r"parameters\.pipeDirectory: Extra inputs are not permitted",
        ),
        (
            claim("gpu-3-shared", [sharing(clients={"other": {"memory": "40Gi"}})]),
            r"parameters\.clients: Extra inputs are not permitted",
        ),
        (
            claim("gpu-3-shared", [sharing(computePercent=0)]),
            r"parameters\.computePercent: Input should be greater than or equal to 1",
        ),
    ],
)
def test_a_share_that_cannot_be_read_as_given_is_refused_naming_the_field(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClaimRefused, match=message):
        read_allocation(body, CLAIM, driver=DRIVER, pool=NODE)
