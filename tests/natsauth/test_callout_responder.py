"""The auth callout's answers, with Kubernetes replaced by a reviewer that says who a token is."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from services.authcallout import CalloutResponder, NodeIdentity, Refused
from services.authcallout.__main__ import nats_tls, parse_args
from tangram.kubernetes.api import KubeApiError
from tangram.natsauth.jwt import decode, decode_auth_request, generate_seed, permissions_of, public_key_of
from tangram.natsauth.permissions import node_permissions
from tests.natsauth.requests import USER_KEY, request_jwt

ISSUER = generate_seed()


class Reviewer:
    """Token `good-<node>` is that node's pod's; anything else is refused."""

    def __init__(self, nodes: list[str], expires_in: int | None = 600) -> None:
        self.fleet = nodes
        self.expires_in = expires_in
        self.reviewed: list[str] = []

    async def review(self, token: str) -> NodeIdentity:
        self.reviewed.append(token)
        if not token.startswith("good-"):
            raise Refused("token not authenticated")
        node = token.removeprefix("good-")
        expires = None if self.expires_in is None else int(time.time()) + self.expires_in
        return NodeIdentity(node=node, namespace="tangram", pod=f"tangram-node-{node}", expires_at=expires)

    async def nodes(self) -> list[str]:
        if not self.fleet:
            raise KubeApiError("list Nodes", 0, "Unreachable")
        return self.fleet


async def answer(responder: CalloutResponder, options: dict[str, object]) -> dict[str, object]:
    response = await responder.answer(request_jwt(options))
    assert response is not None
    claims = decode(response)
    assert claims["iss"] == public_key_of(ISSUER) and claims["sub"] == USER_KEY
    nats = claims["nats"]
    assert isinstance(nats, dict)
    return nats


async def test_a_nodes_token_gets_that_nodes_user_and_permissions_and_no_more() -> None:
    responder = CalloutResponder(Reviewer(["gpu-1", "gpu-2.lab", "gpu-3"]), ISSUER, max_ttl_s=3600)
    before = int(time.time())
    nats = await answer(responder, {"auth_token": "good-gpu-2.lab", "user": "node-gpu-1"})
    user = decode(str(nats["jwt"]))
    assert user["iss"] == public_key_of(ISSUER) and user["sub"] == USER_KEY
    assert user["name"] == "node-gpu-2_lab" and user["aud"] == "TANGRAM"
    assert permissions_of(user) == node_permissions("gpu-2.lab", ["gpu-1", "gpu-3"])
    assert before + 600 <= user["exp"] <= int(time.time()) + 600


async def test_the_user_expires_with_the_token_and_no_later_than_the_longest_allowed() -> None:
    before = int(time.time())
    responder = CalloutResponder(Reviewer(["gpu-1"], expires_in=120), ISSUER, max_ttl_s=3600)
    user = decode(str((await answer(responder, {"auth_token": "good-gpu-1"}))["jwt"]))
    assert before + 120 <= user["exp"] <= int(time.time()) + 120
    forever = await answer(
        CalloutResponder(Reviewer(["gpu-1"], expires_in=None), ISSUER), {"auth_token": "good-gpu-1"}
    )
    assert "does not expire" in str(forever["error"]) and "jwt" not in forever
    too_long = CalloutResponder(Reviewer(["gpu-1"], expires_in=7200), ISSUER, max_ttl_s=3600)
    refused = await answer(too_long, {"auth_token": "good-gpu-1"})
    assert "longer than 3600s" in str(refused["error"]) and "jwt" not in refused


async def test_a_password_is_taken_as_the_token() -> None:
    reviewer = Reviewer(["gpu-1"])
    responder = CalloutResponder(reviewer, ISSUER)
    nats = await answer(responder, {"user": "anything", "pass": "good-gpu-1"})
    assert decode(str(nats["jwt"]))["name"] == "node-gpu-1"
    assert reviewer.reviewed == ["good-gpu-1"]


async def test_refusals_are_answered_with_an_error_and_no_user() -> None:
    responder = CalloutResponder(Reviewer(["gpu-1"]), ISSUER)
    refused = await answer(responder, {"auth_token": "stolen"})
    assert refused["error"] == "token not authenticated" and "jwt" not in refused
    empty = await answer(responder, {})
    assert "no token" in str(empty["error"]) and "jwt" not in empty
    # a fleet that cannot be listed gives no permissions rather than ones missing denials
    unlisted = await answer(CalloutResponder(Reviewer([]), ISSUER), {"auth_token": "good-gpu-1"})
    assert "no permissions" in str(unlisted["error"]) and "jwt" not in unlisted


async def test_a_request_that_is_not_a_servers_is_not_answered() -> None:
    responder = CalloutResponder(Reviewer(["gpu-1"]), ISSUER)
    assert await responder.answer("garbage") is None
    assert await responder.answer(request_jwt({"auth_token": "good-gpu-1"}, seed=generate_seed())) is None
    assert decode_auth_request(request_jwt({"auth_token": "good-gpu-1"})).token == "good-gpu-1"


def test_the_accepted_service_accounts_are_the_given_ones_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANGRAM_CALLOUT_SERVICE_ACCOUNTS", raising=False)
    assert parse_args([]).service_account == ["tangram:tangram-node"]
    given = parse_args(["--service-account", "gpu:nodes", "--service-account", "gpu:more"])
    assert given.service_account == ["gpu:nodes", "gpu:more"]  # the default is not added
    monkeypatch.setenv("TANGRAM_CALLOUT_SERVICE_ACCOUNTS", "a:b,c:d")
    assert parse_args([]).service_account == ["a:b", "c:d"]


def test_a_tls_nats_is_verified_with_the_ca_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The chart's nats.tls.caConfigMap reaches the callout as TANGRAM_NATS_TLS_CA."""
    ca = tmp_path / "ca.crt"
    key = tmp_path / "ca.key"
    new_ca = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subject = ["-days", "1", "-subj", "/CN=tangram-test-ca"]
    subprocess.run([*new_ca, "-keyout", str(key), "-out", str(ca), *subject], check=True, capture_output=True)
    assert parse_args([]).nats_tls_ca is None and nats_tls(None) is None
    monkeypatch.setenv("TANGRAM_NATS_TLS_CA", str(ca))
    given = parse_args([]).nats_tls_ca
    assert given == ca
    context = nats_tls(given)
    assert context is not None
    assert [dict(entry[0] for entry in cert["subject"]) for cert in context.get_ca_certs()] == [
        {"commonName": "tangram-test-ca"}
    ]
    with pytest.raises(SystemExit, match="cannot load the NATS CA"):
        nats_tls(tmp_path / "missing.crt")
