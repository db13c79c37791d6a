"""Pods that use Tangram's claims are gated at admission, against the real control plane.

The webhook: the real `python -m services.admission` process, with the chart's RBAC (as its own
ServiceAccount's token), makes its CA and serving certificate, stores them in its Secret, patches
the caBundle of the chart's MutatingWebhookConfiguration (pointed at loopback and at this test's
namespace only), and the API server calls it over TLS for every pod created. The policy: the
chart's MutatingAdmissionPolicy on a control plane that serves it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio.client import AdmissionregistrationV1Api, CoreV1Api, ResourceV1Api

from services.admission.certs import renew
from services.admission.keeper import material_of, secret_data
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.clusterup import install_device_classes
from tangram.local.controlplane import ControlPlane, Release
from tests.deploy.apiserver import api_request
from tests.e2e.webhook import (
    Served,
    apply,
    delete,
    gates_of,
    objects,
    ready,
    serving,
)
from tests.support.polling import until

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

WAIT_S = 120.0
MIG_CLASS = "mig.gpu.tangram.dev"


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def template(name: str, namespace: str, *classes: str) -> dict[str, Any]:
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def pod(
    name: str,
    *,
    templates: tuple[str, ...] = (),
    claims: tuple[str, ...] = (),
    gates: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": f"c{i}"} for i in range(len(templates))]},
            }
        ]
    }
    if templates:
        spec["resourceClaims"] = [
            {"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
        ]
    if claims:  # a claim made beforehand, shared or not, by name
        spec["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
        spec["containers"][0]["resources"]["claims"] = [{"name": f"c{i}"} for i in range(len(claims))]
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


@pytest.fixture
async def served(controlplane: ControlPlane, kube: Any, unique: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(controlplane, kube, unique, tmp_path) as state:
        yield state


async def test_the_webhook_gates_only_pods_with_tangram_claims(
    kube: Any, served: Served, unique: str
) -> None:
    ns = served.namespace
    resource = ResourceV1Api(kube)
    await install_device_classes(kube)
    foreign = f"{unique}-foreign"
    ours = f"{unique}-our-mig"  # a class made in the cluster counts as much as the shipped ones
    classes = [
        device_class(foreign, 'device.driver == "gpu.example.com"'),
        device_class(
            ours, 'device.driver == "gpu.tangram.dev" && device.attributes["gpu.tangram.dev"].type == "mig"'
        ),
    ]
    for cls in classes:
        await call(f"create DeviceClass {cls['metadata']['name']}", resource.create_device_class(cls))
    try:
        for name, cls in (
            ("mig-1g", (MIG_CLASS,)),
            ("ours", (ours,)),
            ("foreign", (foreign,)),
            ("mixed", (MIG_CLASS, foreign)),
        ):
            await resource.create_namespaced_resource_claim_template(ns, template(name, ns, *cls))

        # the CA the webhook made is the one the API server was given, and the one in its Secret
        config = await api_request(
            kube,
            "GET",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{served.configuration}",
        )
        bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
        secret = await call(
            "read the Secret", CoreV1Api(kube).read_namespaced_secret("tangram-admission-tls", ns)
        )
        assert base64.b64decode(secret.data["ca.crt"]) == bundle and b"BEGIN CERTIFICATE" in bundle

        async def gated_in_a_dry_run() -> bool:
            # the API server picks up a new webhook configuration within a moment
            return SCHEDULING_GATE in await gates_of(
                kube, ns, pod("probe", templates=("mig-1g",)), dry_run=True
            )

        await until("the API server calling the webhook", gated_in_a_dry_run, WAIT_S)

        assert await gates_of(kube, ns, pod("tangram-1g", templates=("mig-1g",))) == [SCHEDULING_GATE]
        for name, cls in (("claim-1g", (MIG_CLASS,)), ("claim-foreign", (foreign,))):
            claim = template(name, ns, *cls)
            claim["kind"], claim["spec"] = "ResourceClaim", claim["spec"]["spec"]
            await resource.create_namespaced_resource_claim(ns, claim)
        assert await gates_of(kube, ns, pod("by-claim", claims=("claim-1g",))) == [SCHEDULING_GATE]
        assert await gates_of(kube, ns, pod("by-foreign-claim", claims=("claim-foreign",))) == []
        assert await gates_of(kube, ns, pod("cluster-class", templates=("ours",))) == [SCHEDULING_GATE]
        # a Tangram claim beside a foreign one: Tangram decides its claim, kube-scheduler the other
        assert await gates_of(kube, ns, pod("two-claims", templates=("mig-1g", "foreign"))) == [
            SCHEDULING_GATE
        ]
        assert await gates_of(kube, ns, pod("foreign", templates=("foreign",))) == []
        assert await gates_of(kube, ns, pod("mixed", templates=("mixed",))) == []
        assert await gates_of(kube, ns, pod("no-claims")) == []
        assert await gates_of(kube, ns, pod("missing-template", templates=("nowhere",))) == []
        opted_out = pod("opted-out", templates=("mig-1g",), labels={"gpu.tangram.dev/admission": "disabled"})
        assert await gates_of(kube, ns, opted_out) == []
        # idempotent: a pod that holds the gate keeps one; other gates stay
        assert await gates_of(kube, ns, pod("gated", templates=("mig-1g",), gates=(SCHEDULING_GATE,))) == [
            SCHEDULING_GATE
        ]
        assert await gates_of(
            kube, ns, pod("other-gate", templates=("mig-1g",), gates=("example.com/x",))
        ) == [
            "example.com/x",
            SCHEDULING_GATE,
        ]
    finally:
        for cls in classes:
            with contextlib.suppress(KubeApiError):
                await call("delete DeviceClass", resource.delete_device_class(cls["metadata"]["name"]))


async def test_a_restarted_webhook_reuses_its_certificates(kube: Any, served: Served) -> None:
    core = CoreV1Api(kube)
    before = await call(
        "read the Secret", core.read_namespaced_secret("tangram-admission-tls", served.namespace)
    )
    assert served.webhook.stop() == 0  # SIGTERM: a clean exit
    # failurePolicy Fail: while the webhook is down a pod with claims is refused, never admitted
    # ungated (kube-scheduler would allocate Tangram's devices beside Tangram's allocator); a pod
    # without claims never reaches the webhook
    with pytest.raises(KubeApiError) as refused:
        await gates_of(kube, served.namespace, pod("while-down", templates=("mig-1g",)), dry_run=True)
    assert refused.value.status == 500 and "failed calling webhook" in str(refused.value)
    assert "pods.admission.gpu.tangram.dev" in str(refused.value)
    assert await gates_of(kube, served.namespace, pod("no-claims-while-down"), dry_run=True) == []
    served.webhook = served.start()
    await until("the restarted webhook ready", lambda: ready(served.webhook), WAIT_S)
    after = await call(
        "read the Secret", core.read_namespaced_secret("tangram-admission-tls", served.namespace)
    )
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.data == before.data


async def test_the_webhook_refuses_what_is_not_a_review_and_is_served_only_over_tls(served: Served) -> None:
    config = served.webhook
    async with aiohttp.ClientSession() as session, session.get(f"{config.health}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    assert "tangram_admission_reviews_total" in text
    (expiry,) = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("tangram_admission_certificate_expiry_timestamp_seconds ")
    ]
    assert expiry > datetime.now(UTC).timestamp() + 300 * 86400  # a year's certificate, fresh
    port = served.port
    # the port speaks only TLS, with a certificate no system CA vouches for
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.post(f"https://127.0.0.1:{port}/mutate", data=b"{}")
        with pytest.raises(aiohttp.ClientError):
            await session.post(f"http://127.0.0.1:{port}/mutate", data=b"{}")


async def served_certificate(port: int, bundle: bytes) -> bytes:
    """The certificate the webhook serves a new connection (DER), verified against `bundle`."""
    context = ssl.create_default_context(cadata=bundle.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return der
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


async def test_the_running_webhook_serves_a_renewed_certificate_and_restores_its_ca_bundle(
    kube: Any, served: Served
) -> None:
    core = CoreV1Api(kube)
    admission = AdmissionregistrationV1Api(kube)
    secret = await call(
        "read the Secret", core.read_namespaced_secret("tangram-admission-tls", served.namespace)
    )
    current = material_of({"data": secret.data})
    assert current is not None
    served_now = await served_certificate(served.port, current.ca_bundle)
    assert served_now == x509.load_pem_x509_certificate(current.cert).public_bytes(serialization.Encoding.DER)
    # another replica renews the serving certificate (same CA): this one picks it up, no restart
    # (a new name makes it due now; the names this replica needs are all in it)
    renewed = renew(current, ("127.0.0.1", "admission.example"), datetime.now(UTC))
    assert renewed is not None and renewed.ca_bundle == current.ca_bundle
    secret.data = secret_data(renewed)
    await call(
        "renew the Secret", core.replace_namespaced_secret("tangram-admission-tls", served.namespace, secret)
    )
    wanted = x509.load_pem_x509_certificate(renewed.cert).public_bytes(serialization.Encoding.DER)

    async def serving_renewed() -> bool:
        return await served_certificate(served.port, current.ca_bundle) == wanted

    await until("the renewed certificate served", serving_renewed, WAIT_S)
    # someone strips the caBundle: the webhook writes it back
    stripped = [{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}]
    await call(
        "strip the caBundle", admission.patch_mutating_webhook_configuration(served.configuration, stripped)
    )

    async def restored() -> bool:
        found = await call(
            "read the configuration", admission.read_mutating_webhook_configuration(served.configuration)
        )
        bundle = found.webhooks[0].client_config.ca_bundle
        return bundle is not None and base64.b64decode(bundle) == current.ca_bundle

    await until("the caBundle restored", restored, WAIT_S)
    assert served.webhook.process.poll() is None


# --- the MutatingAdmissionPolicy -------------------------------------------------------------


async def test_the_policy_gates_pods_with_claims_in_opted_in_namespaces(
    kube_admission_policies: Any, release: Release, unique: str
) -> None:
    kube = kube_admission_policies
    core = CoreV1Api(kube)
    enabled, other = unique, f"{unique[:50]}-off"
    rendered = objects({"admission.mode": "policy"}, enabled, kube_version=f"{release.minor}.0")
    (policy,) = [o for o in rendered if o["kind"] == "MutatingAdmissionPolicy"]
    (binding,) = [o for o in rendered if o["kind"] == "MutatingAdmissionPolicyBinding"]
    # beta (and deprecated from 1.37) before 1.36, GA after: the chart picks by the cluster's version
    served = {"1.34": "admissionregistration.k8s.io/v1beta1", "1.37": "admissionregistration.k8s.io/v1"}
    assert policy["apiVersion"] == served[release.minor]
    policy["metadata"]["name"] = binding["metadata"]["name"] = binding["spec"]["policyName"] = (
        f"{unique}-gate"
    )
    # only this test's namespace: the chart's label, plus its name (the control plane is shared)
    binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] = (
        enabled
    )
    await call(
        "create the opted-in namespace",
        core.create_namespace(
            {"metadata": {"name": enabled, "labels": {"gpu.tangram.dev/admission": "enabled"}}}
        ),
    )
    await call("create another namespace", core.create_namespace({"metadata": {"name": other}}))
    try:
        for obj in (policy, binding):
            await apply(kube, obj)

        async def gated_in_a_dry_run() -> bool:
            return SCHEDULING_GATE in await gates_of(
                kube, enabled, pod("probe", templates=("any",)), dry_run=True
            )

        await until("the API server applying the policy", gated_in_a_dry_run, WAIT_S)
        assert await gates_of(kube, enabled, pod("with-claims", templates=("any",))) == [SCHEDULING_GATE]
        assert await gates_of(kube, enabled, pod("gated", templates=("any",), gates=(SCHEDULING_GATE,))) == [
            SCHEDULING_GATE
        ]
        assert await gates_of(
            kube, enabled, pod("other-gate", templates=("any",), gates=("example.com/x",))
        ) == [
            "example.com/x",
            SCHEDULING_GATE,
        ]
        assert await gates_of(kube, enabled, pod("no-claims")) == []
        opted_out = pod("opted-out", templates=("any",), labels={"gpu.tangram.dev/admission": "disabled"})
        assert await gates_of(kube, enabled, opted_out) == []
        assert await gates_of(kube, other, pod("elsewhere", templates=("any",))) == []
    finally:
        for obj in (binding, policy):
            await delete(kube, obj)
        for namespace in (enabled, other):
            with contextlib.suppress(KubeApiError):
                await call("delete namespace", core.delete_namespace(namespace))
