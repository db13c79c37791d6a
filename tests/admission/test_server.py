"""The webhook's HTTPS endpoint, in process, with its claim look-ups stubbed: what it answers to
the API server and to anything else that reaches its port."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.admission.certs import TlsMaterial, issue
from services.admission.server import AdmissionServer, server_tls
from tangram.kubernetes.api import KubeApiError
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tests.admission.reviews import StubLookup, review

MAX_BODY = 64 * 1024


@pytest.fixture
def material() -> TlsMaterial:
    return issue(("localhost", "127.0.0.1"), datetime.now(UTC))


@pytest.fixture
async def served(
    tmp_path: Path, material: TlsMaterial
) -> AsyncIterator[tuple[str, StubLookup, ssl.SSLContext]]:
    lookup = StubLookup()
    server = AdmissionServer(lookup, lookup_timeout_s=1.0, max_body_bytes=MAX_BODY)  # type: ignore[arg-type]
    tls = server_tls(tmp_path / "tls", material)
    await server.start("127.0.0.1", 0, tls)
    client_tls = ssl.create_default_context(cadata=material.ca_bundle.decode())
    try:
        yield f"https://127.0.0.1:{server.port}/mutate", lookup, client_tls
    finally:
        await server.stop()


async def post(
    url: str, tls: ssl.SSLContext, body: bytes, content_type: str = "application/json"
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers={"Content-Type": content_type}, ssl=tls) as response,
    ):
        text = await response.text()
        return response.status, json.loads(text) if text.startswith("{") else text


def with_claims(*templates: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "resourceClaims": [
                {"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
            ],
        },
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    response = answer["response"]
    assert response["allowed"] is True
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else None


async def test_a_pod_with_a_tangram_claim_gets_the_gate(
    served: tuple[str, StubLookup, ssl.SSLContext],
) -> None:
    url, lookup, tls = served
    status, answer = await post(url, tls, json.dumps(review(with_claims("tangram-1g"))).encode())
    assert status == 200 and answer["response"]["uid"] == "0b5d-1"
    assert patch_of(answer) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": SCHEDULING_GATE}]}
    ]
    assert lookup.asked == [("team-a", [("ResourceClaimTemplate", "tangram-1g")])]


async def test_other_pods_pass_unchanged_and_a_gated_pod_is_not_gated_twice(
    served: tuple[str, StubLookup, ssl.SSLContext],
) -> None:
    url, lookup, tls = served
    for pod in (with_claims("foreign"), with_claims(), {"metadata": {}, "spec": {}}):
        status, answer = await post(url, tls, json.dumps(review(pod)).encode())
        assert status == 200 and patch_of(answer) is None
    gated = with_claims("tangram-1g")
    gated["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    status, answer = await post(url, tls, json.dumps(review(gated)).encode())
    assert status == 200 and patch_of(answer) is None
    # pods without claims, and pods gated already, cost no look-up
    assert [refs for _, refs in lookup.asked] == [[("ResourceClaimTemplate", "foreign")]]


@pytest.mark.parametrize("failure", [KubeApiError("read", 0, "Unreachable"), TimeoutError()])
async def test_claims_that_cannot_be_read_gate_the_pod_all_the_same(
    served: tuple[str, StubLookup, ssl.SSLContext], failure: Exception
) -> None:
    # let through, kube-scheduler would allocate Tangram's devices beside Tangram's allocator
    url, lookup, tls = served
    lookup.fail = failure
    status, answer = await post(url, tls, json.dumps(review(with_claims("tangram-1g"))).encode())
    assert status == 200 and answer["response"]["allowed"] is True
    assert patch_of(answer) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "gpu.tangram.dev/allocation"}]}
    ]


async def test_reviews_of_other_resources_or_operations_are_allowed_without_a_patch(
    served: tuple[str, StubLookup, ssl.SSLContext],
) -> None:
    url, lookup, tls = served
    other = review(with_claims("tangram-1g"), kind={"group": "apps", "version": "v1", "kind": "Deployment"})
    update = review(with_claims("tangram-1g"), operation="UPDATE")
    for body in (other, update):
        status, answer = await post(url, tls, json.dumps(body).encode())
        assert status == 200 and answer["response"] == {"uid": "0b5d-1", "allowed": True}
    assert lookup.asked == []


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{not json", "application/json", 400),
        (b'{"apiVersion": "v1", "kind": "Pod"}', "application/json", 400),
        (json.dumps(review()).encode(), "text/plain", 415),
        (b"x" * (MAX_BODY + 1), "application/json", 413),
        (b"[" * 20_000 + b"]" * 20_000, "application/json", 400),  # nesting past the parser's depth
    ],
)
async def test_bad_bodies_are_refused_with_a_clear_status(
    served: tuple[str, StubLookup, ssl.SSLContext], body: bytes, content_type: str, status: int
) -> None:
    url, _, tls = served
    got, answer = await post(url, tls, body, content_type)
    assert got == status and "error" in answer
    # and the server still answers the next review
    good, _ = await post(url, tls, json.dumps(review(with_claims("tangram-1g"))).encode())
    assert good == 200


async def test_an_oversized_chunked_body_is_refused(served: tuple[str, StubLookup, ssl.SSLContext]) -> None:
    url, _, tls = served

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 1024 + 8):
            yield b"x" * 1024

    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(
                url, data=chunks(), headers={"Content-Type": "application/json"}, ssl=tls
            ) as response:
                status = response.status
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            status = 413  # the server may close the connection while the client still sends
    assert status == 413


async def test_a_client_that_does_not_trust_the_ca_or_names_another_host_is_not_served(
    served: tuple[str, StubLookup, ssl.SSLContext],
) -> None:
    url, _, _ = served
    body = json.dumps(review(with_claims("tangram-1g"))).encode()
    stranger = issue(("127.0.0.1",), datetime.now(UTC))
    wrong_ca = ssl.create_default_context(cadata=stranger.ca_bundle.decode())
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await post(url, wrong_ca, body)
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await post(url, ssl.create_default_context(), body)  # the system's CAs
    # the right CA, but the certificate does not name the host the client asked for
    _, _, trusted = served
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.post(url, data=body, ssl=trusted, server_hostname="evil.example")


async def test_plain_http_gets_no_answer(served: tuple[str, StubLookup, ssl.SSLContext]) -> None:
    url, lookup, _ = served
    with pytest.raises(aiohttp.ClientError):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url.replace("https", "http"), data=json.dumps(review(with_claims("tangram-1g")))
            ) as response,
        ):
            await response.read()
    assert lookup.asked == []


async def test_a_renewed_certificate_is_served_to_new_connections(
    tmp_path: Path, material: TlsMaterial
) -> None:
    server = AdmissionServer(StubLookup())  # type: ignore[arg-type]
    tls = server_tls(tmp_path, material)
    await server.start("127.0.0.1", 0, tls)
    try:
        renewed = issue(("127.0.0.1",), datetime.now(UTC))
        server_tls(tmp_path, renewed, tls)
        url = f"https://127.0.0.1:{server.port}/mutate"
        body = json.dumps(review()).encode()
        status, _ = await post(url, ssl.create_default_context(cadata=renewed.ca_bundle.decode()), body)
        assert status == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post(url, ssl.create_default_context(cadata=material.ca_bundle.decode()), body)
        assert oct((tmp_path / "tls.key").stat().st_mode & 0o777) == "0o600"
    finally:
        await server.stop()
        await asyncio.sleep(0)
