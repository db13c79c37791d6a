"""Fixtures for a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler from the pinned release), started once per test session and shared.

Tests share a control plane, so each one uses its own names: `unique` gives a DNS-label prefix
per test, and Nodes, namespaces and slices are named from it. Two control planes exist, started
only when a test asks for them: `controlplane` with the feature gates the 1.34 layout needs
(partitionable devices, device taints) and `controlplane_whole_devices` with partitionable
devices off, as most 1.34 clusters run; `controlplane_admission_policies` serves
MutatingAdmissionPolicy besides.

    async def test_x(kube: Any, unique: str) -> None:
        node = await register_node(kube, f"{unique}-node")
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tangram.local.controlplane import (
    PARTITIONABLE_GATES,
    WHOLE_DEVICE_GATES,
    ControlPlane,
    runtime_config_for,
)

# MutatingAdmissionPolicy is beta and off by default on 1.34: its gate, and its API version served.
ADMISSION_POLICY_GATES = {**PARTITIONABLE_GATES, "MutatingAdmissionPolicy": True}
ADMISSION_POLICY_RUNTIME_CONFIG = ",".join(
    [runtime_config_for(PARTITIONABLE_GATES), "admissionregistration.k8s.io/v1beta1=true"]
)


@pytest.fixture(scope="session")
def controlplane() -> Iterator[ControlPlane]:
    with ControlPlane(feature_gates=PARTITIONABLE_GATES) as plane:
        yield plane


@pytest.fixture(scope="session")
def controlplane_whole_devices() -> Iterator[ControlPlane]:
    with ControlPlane(feature_gates=WHOLE_DEVICE_GATES) as plane:
        yield plane


@pytest.fixture(scope="session")
def controlplane_admission_policies() -> Iterator[ControlPlane]:
    """A control plane that serves MutatingAdmissionPolicy (admissionregistration.k8s.io/v1beta1)."""
    with ControlPlane(
        feature_gates=ADMISSION_POLICY_GATES, runtime_config=ADMISSION_POLICY_RUNTIME_CONFIG
    ) as plane:
        yield plane


@pytest.fixture
async def kube_admission_policies(controlplane_admission_policies: ControlPlane) -> AsyncIterator[Any]:
    client = await controlplane_admission_policies.client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def kube(controlplane: ControlPlane) -> AsyncIterator[Any]:
    """An ApiClient for `controlplane`, as cluster admin."""
    client = await controlplane.client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def kube_whole_devices(controlplane_whole_devices: ControlPlane) -> AsyncIterator[Any]:
    client = await controlplane_whole_devices.client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A DNS label unique to this test run: the test's name, shortened, and a random suffix."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    return f"{name}-{secrets.token_hex(3)}"
