"""Fixtures for a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler from a pinned release), started once per test session and shared.

Every test on a control plane runs once per release (`release`: the newest Kubernetes and the
oldest Tangram supports; the test ids end in [1.34] or [1.37]); the planes are session fixtures,
so pytest runs one release's tests together. Tests share a plane, so each one uses its own names:
`unique` gives a DNS-label prefix per test, and Nodes, namespaces and slices are named from it.
Three planes exist, started only when a test asks for them: `controlplane` with partitionable
devices and device taints on (alpha gates on 1.34, defaults from 1.36),
`controlplane_whole_devices` with partitionable devices off, as most 1.34 clusters run, and
`controlplane_admission_policies`, which serves MutatingAdmissionPolicy besides.

    async def test_x(kube: Any, unique: str) -> None:
        node = await register_node(kube, f"{unique}-node")
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tangram.local.controlplane import RELEASES, ControlPlane, Release


def _admission_policy_plane(rel: Release) -> ControlPlane:
    """MutatingAdmissionPolicy on 1.34 is beta and off by default: its gate, and
    admissionregistration.k8s.io/v1beta1 served. From 1.36 it is GA, served at v1 by default."""
    if not rel.dra_alpha:
        return ControlPlane(release=rel)
    gates = {**rel.gates(), "MutatingAdmissionPolicy": True}
    runtime = ",".join([rel.runtime_config(gates), "admissionregistration.k8s.io/v1beta1=true"])
    return ControlPlane(release=rel, feature_gates=gates, runtime_config=runtime)


@pytest.fixture(scope="session", params=RELEASES, ids=[r.minor for r in RELEASES])
def release(request: pytest.FixtureRequest) -> Release:
    rel: Release = request.param
    return rel


@pytest.fixture(scope="session")
def controlplane(release: Release) -> Iterator[ControlPlane]:
    with ControlPlane(release=release) as plane:
        yield plane


@pytest.fixture(scope="session")
def controlplane_whole_devices(release: Release) -> Iterator[ControlPlane]:
    """Partitionable devices off, as most 1.34 clusters run (and a 1.36+ cluster may choose)."""
    with ControlPlane(release=release, feature_gates=release.gates(partitionable=False)) as plane:
        yield plane


@pytest.fixture(scope="session")
def controlplane_admission_policies(release: Release) -> Iterator[ControlPlane]:
    """A control plane that serves MutatingAdmissionPolicy (admissionregistration.k8s.io/v1beta1)."""
    with _admission_policy_plane(release) as plane:
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
