"""The webhook's API-side parts against the real API server: certificates kept in a Secret by
replicas that race, renewed under the same CA, the caBundle patched and restored; and claims and
classes looked up and judged."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client import AdmissionregistrationV1Api, CoreV1Api, ResourceV1Api

from services.admission.keeper import CertificateKeeper, material_of
from services.admission.lookup import ClaimLookup
from tangram.kubernetes.api import KubeApiError, call

pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]

NOW = datetime.now(UTC)
HOSTS = ("tangram-admission.x.svc", "127.0.0.1")


@pytest.fixture
async def namespace(kube: Any, unique: str) -> AsyncIterator[str]:
    await call("create namespace", CoreV1Api(kube).create_namespace({"metadata": {"name": unique}}))
    try:
        yield unique
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", CoreV1Api(kube).delete_namespace(unique))


@pytest.fixture
async def configuration(kube: Any, unique: str) -> AsyncIterator[str]:
    """A MutatingWebhookConfiguration with two webhooks that no request ever matches."""
    name = f"{unique}-keeper"
    never = {"matchLabels": {"tangram-test/never": unique}}
    hooks = [
        {
            "name": f"{n}.{unique}.tangram.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "clientConfig": {"url": "https://127.0.0.1:9/mutate"},
            "namespaceSelector": never,
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ],
        }
        for n in ("a", "b")
    ]
    api = AdmissionregistrationV1Api(kube)
    body = {"metadata": {"name": name}, "webhooks": hooks}
    await call("create the configuration", api.create_mutating_webhook_configuration(body))
    try:
        yield name
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete the configuration", api.delete_mutating_webhook_configuration(name))


def keeper(
    kube: Any, namespace: str, configuration: str | None = None, *, at: datetime = NOW
) -> CertificateKeeper:
    return CertificateKeeper(
        kube,
        namespace=namespace,
        secret="tangram-admission-tls",
        webhook_configuration=configuration,
        hosts=HOSTS,
        now=lambda: at,
    )


async def stored(kube: Any, namespace: str) -> Any:
    return await call(
        "read the Secret", CoreV1Api(kube).read_namespaced_secret("tangram-admission-tls", namespace)
    )


async def test_replicas_starting_together_serve_one_certificate(kube: Any, namespace: str) -> None:
    replicas = [keeper(kube, namespace) for _ in range(3)]
    materials = await asyncio.gather(*(r.ensure_material() for r in replicas))
    assert materials[0] == materials[1] == materials[2]
    secret = await stored(kube, namespace)
    assert material_of({"data": secret.data}) == materials[0]
    # a later start reuses it untouched
    assert await keeper(kube, namespace).ensure_material() == materials[0]
    assert (await stored(kube, namespace)).metadata.resource_version == secret.metadata.resource_version


async def test_renewal_writes_a_new_serving_certificate_under_the_same_ca(kube: Any, namespace: str) -> None:
    first = await keeper(kube, namespace).ensure_material()
    later = await keeper(kube, namespace, at=NOW + timedelta(days=300)).ensure_material()
    assert later.cert != first.cert and later.key != first.key
    assert later.ca_bundle == first.ca_bundle  # the API server's trust does not change
    assert material_of({"data": (await stored(kube, namespace)).data}) == later


async def test_a_secret_holding_garbage_is_replaced(kube: Any, namespace: str) -> None:
    body = {
        "metadata": {"name": "tangram-admission-tls"},
        "data": {"tls.crt": base64.b64encode(b"junk").decode()},
    }
    await call("create a broken Secret", CoreV1Api(kube).create_namespaced_secret(namespace, body))
    material = await keeper(kube, namespace).ensure_material()
    assert b"BEGIN CERTIFICATE" in material.cert
    assert material_of({"data": (await stored(kube, namespace)).data}) == material


async def test_the_ca_bundle_is_patched_once_and_restored_when_removed(
    kube: Any, namespace: str, configuration: str
) -> None:
    api = AdmissionregistrationV1Api(kube)
    keep = keeper(kube, namespace, configuration)
    material = await keep.ensure_material()
    assert await keep.ensure_ca_bundle(material) is True
    assert await keep.ensure_ca_bundle(material) is False  # nothing to do the second time

    async def bundles() -> list[bytes | None]:
        found = await call("read the configuration", api.read_mutating_webhook_configuration(configuration))
        return [
            base64.b64decode(w.client_config.ca_bundle) if w.client_config.ca_bundle else None
            for w in found.webhooks
        ]

    assert await bundles() == [material.ca_bundle, material.ca_bundle]
    removed = [{"op": "remove", "path": "/webhooks/1/clientConfig/caBundle"}]
    await call("remove one caBundle", api.patch_mutating_webhook_configuration(configuration, removed))
    assert await bundles() == [material.ca_bundle, None]
    assert await keep.ensure_ca_bundle(material) is True
    assert await bundles() == [material.ca_bundle, material.ca_bundle]


async def test_a_missing_configuration_is_an_api_error_not_a_crash(
    kube: Any, namespace: str, unique: str
) -> None:
    keep = keeper(kube, namespace, f"{unique}-nowhere")
    material = await keep.ensure_material()
    with pytest.raises(KubeApiError) as caught:
        await keep.ensure_ca_bundle(material)
    assert caught.value.not_found


# --- claims and classes ----------------------------------------------------------------------


def claim_spec(*classes: str) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
        }
    }


async def test_claims_and_templates_are_judged_by_their_classes(
    kube: Any, namespace: str, unique: str
) -> None:
    resource = ResourceV1Api(kube)
    ours, theirs = f"{unique}-ours", f"{unique}-theirs"
    classes = {
        ours: 'device.driver == "gpu.tangram.dev"',
        theirs: 'device.driver == "gpu.example.com"',
    }
    for name, expression in classes.items():
        body = {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
        await call("create a class", resource.create_device_class(body))
    try:
        for name, spec in (("t-ours", claim_spec(ours)), ("t-mixed", claim_spec(ours, theirs))):
            body = {"metadata": {"name": name}, "spec": {"spec": spec}}
            await call(
                "create a template", resource.create_namespaced_resource_claim_template(namespace, body)
            )
        for name, spec in (("c-ours", claim_spec(ours)), ("c-allocated", claim_spec(ours))):
            await call(
                "create a claim",
                resource.create_namespaced_resource_claim(
                    namespace, {"metadata": {"name": name}, "spec": spec}
                ),
            )
        allocated = await call(
            "read the claim", resource.read_namespaced_resource_claim("c-allocated", namespace)
        )
        status = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": "c-allocated",
                "namespace": namespace,
                "resourceVersion": allocated.metadata.resource_version,
            },
            "spec": claim_spec(ours),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "r0", "driver": "gpu.tangram.dev", "pool": "n1", "device": "gpu-0"}
                        ]
                    }
                }
            },
        }
        await call(
            "allocate the claim",
            resource.replace_namespaced_resource_claim_status("c-allocated", namespace, status),
        )
        lookup = ClaimLookup(kube)
        assert (await lookup.verdict(namespace, [("ResourceClaimTemplate", "t-ours")])).gate
        assert (await lookup.verdict(namespace, [("ResourceClaim", "c-ours")])).gate
        mixed = await lookup.verdict(namespace, [("ResourceClaimTemplate", "t-mixed")])
        assert not mixed.gate and "mixed drivers" in mixed.reason
        done = await lookup.verdict(namespace, [("ResourceClaim", "c-allocated")])
        assert not done.gate and "allocated already" in done.reason
        missing = await lookup.verdict(namespace, [("ResourceClaim", "nowhere")])
        assert not missing.gate and "not found" in missing.reason
        # one Tangram claim among others is enough
        assert (
            await lookup.verdict(
                namespace, [("ResourceClaim", "nowhere"), ("ResourceClaimTemplate", "t-ours")]
            )
        ).gate
    finally:
        for name in classes:
            with contextlib.suppress(KubeApiError):
                await call("delete a class", resource.delete_device_class(name))


async def test_a_class_changed_in_the_cluster_counts_once_the_cache_expires(
    kube: Any, namespace: str, unique: str
) -> None:
    resource = ResourceV1Api(kube)
    name = f"{unique}-changing"
    body = {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
    }
    await call("create the class", resource.create_device_class(body))
    try:
        clock = [0.0]
        lookup = ClaimLookup(kube, class_ttl_s=10.0, clock=lambda: clock[0])
        assert not await lookup.is_tangram_class(name)
        body["spec"]["selectors"][0]["cel"]["expression"] = 'device.driver == "gpu.tangram.dev"'
        await call("change the class", resource.patch_device_class(name, {"spec": body["spec"]}))
        assert not await lookup.is_tangram_class(name)  # cached
        clock[0] = 11.0
        assert await lookup.is_tangram_class(name)
        assert not await lookup.is_tangram_class(f"{unique}-no-such-class")
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete the class", resource.delete_device_class(name))
