"""NATS JWTs: signing, verification, the auth callout's request and response, user claims."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tangram.bus.config import TokenFile, token_expiry
from tangram.natsauth.jwt import (
    NatsJwtError,
    auth_response,
    decode,
    decode_auth_request,
    encode,
    generate_seed,
    permissions_of,
    public_key_of,
    user_claims,
)
from tangram.natsauth.permissions import (
    CALLOUT_USER,
    NatsAuthError,
    Permissions,
    build_callout_users,
    node_permissions,
    render_callout_authorization,
)
from tangram.service.runner import bus_config
from tangram.service.settings import NodeSettings, ServiceSettings
from tests.natsauth.requests import SERVER_SEED, USER_KEY, request_jwt


def test_signed_claims_verify_against_their_issuer_and_tampering_does_not() -> None:
    seed = generate_seed()
    token = encode({"sub": USER_KEY, "iat": 1}, seed)
    header, claims, signature = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"typ": "JWT", "alg": "ed25519-nkey"}
    decoded = decode(token)
    assert decoded["iss"] == public_key_of(seed) and decoded["iss"].startswith("A")
    assert decoded["sub"] == USER_KEY and decoded["jti"]
    forged = base64.urlsafe_b64encode(json.dumps({**decoded, "sub": "UOTHER"}).encode()).rstrip(b"=").decode()
    with pytest.raises(NatsJwtError, match="signature"):
        decode(f"{header}.{forged}.{signature}")
    # the same claims signed by another key but naming the first as issuer
    other = encode({"sub": USER_KEY, "iat": 1}, generate_seed())
    with pytest.raises(NatsJwtError, match="signature"):
        decode(f"{header}.{claims}.{other.split('.')[2]}")


@pytest.mark.parametrize("garbage", ["", "a.b", "a.b.c", "eyJ9.eyJ9.AA", "not a jwt at all"])
def test_garbage_is_not_a_jwt(garbage: str) -> None:
    with pytest.raises(NatsJwtError):
        decode(garbage)


def test_expired_claims_are_refused() -> None:
    token = encode({"sub": USER_KEY, "iat": 1, "exp": 100}, generate_seed())
    with pytest.raises(NatsJwtError, match="expired"):
        decode(token, now=100)
    assert decode(token, now=99)["exp"] == 100


def test_a_seed_is_needed_to_sign() -> None:
    with pytest.raises(NatsJwtError, match="seed"):
        encode({}, public_key_of(generate_seed()))


def test_an_authorization_request_names_the_server_the_user_key_and_the_token() -> None:
    request = decode_auth_request(request_jwt({"auth_token": "the-token", "user": "node-x"}))
    assert request.server_id == public_key_of(SERVER_SEED)
    assert request.user_nkey == USER_KEY
    assert request.token == "the-token" and request.user == "node-x" and request.password is None
    assert request.client_host == "10.0.0.7"


def test_requests_not_from_a_server_are_refused() -> None:
    # signed by an account key, not a server's
    with pytest.raises(NatsJwtError, match="server"):
        decode_auth_request(request_jwt({}, seed=generate_seed()))
    # a server id that is not its signer
    with pytest.raises(NatsJwtError, match="signer"):
        decode_auth_request(request_jwt({}, server_id=public_key_of(generate_seed("server"))))
    # a user JWT is not a request
    with pytest.raises(NatsJwtError, match="not an authorization request"):
        decode_auth_request(encode({"sub": USER_KEY, "nats": {"type": "user"}}, SERVER_SEED))


def test_user_claims_carry_exactly_the_node_permissions() -> None:
    permissions = node_permissions("gpu-1", ["gpu-2"])
    seed = generate_seed()
    claims = user_claims(
        user_nkey=USER_KEY,
        name="node-gpu-1",
        account="TANGRAM",
        permissions=permissions,
        issued_at=10,
        expires_at=20,
    )
    decoded = decode(encode(claims, seed), now=15)
    assert decoded["aud"] == "TANGRAM" and decoded["name"] == "node-gpu-1" and decoded["exp"] == 20
    assert decoded["nats"]["type"] == "user" and decoded["nats"]["version"] == 2
    assert permissions_of(decoded) == permissions


def test_a_response_answers_one_server_and_one_user_key() -> None:
    request = decode_auth_request(request_jwt({"auth_token": "t"}))
    seed = generate_seed()
    granted = decode(auth_response(request, seed, user_jwt="the.user.jwt"))
    assert granted["aud"] == request.server_id and granted["sub"] == USER_KEY
    assert granted["nats"] == {"type": "authorization_response", "version": 2, "jwt": "the.user.jwt"}
    refused = decode(auth_response(request, seed, error="no"))
    assert refused["nats"]["error"] == "no" and "jwt" not in refused["nats"]
    with pytest.raises(ValueError):
        auth_response(request, seed)


def test_the_callout_config_lists_static_users_and_hands_the_rest_to_the_callout() -> None:
    users = build_callout_users()
    issuer = public_key_of(generate_seed())
    text = render_callout_authorization(users, issuer)
    assert [user.name for user in users] == ["admin", "allocator", CALLOUT_USER]
    assert f'issuer: "{issuer}"' in text
    assert 'auth_users: ["admin", "allocator", "authcallout"]' in text
    assert "jetstream: enabled" in text and 'account: "TANGRAM"' in text
    assert "allow_responses: true" in text  # only the callout's user answers requests
    assert text.count("allow_responses") == 1
    with pytest.raises(NatsAuthError, match="account public nkey"):
        render_callout_authorization(users, public_key_of(generate_seed("user")))
    with pytest.raises(NatsAuthError, match="callout's own user"):
        render_callout_authorization(users[:2], issuer)


def test_callout_user_may_only_receive_authorization_requests() -> None:
    callout = next(user for user in build_callout_users() if user.name == CALLOUT_USER)
    assert callout.permissions == Permissions(
        publish_allow=(),
        subscribe_allow=("$SYS.REQ.USER.AUTH",),
        subscribe_deny=("_INBOX.>",),
        allow_responses=True,
    )


def test_the_token_file_is_read_at_each_connection(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    read = TokenFile(str(path))
    assert read() == "first" and read.sent == "first"
    path.write_text("rotated\n")  # the kubelet rewrites the projected token
    assert read.read() == "rotated" and read.sent == "first"  # looked at, not sent
    assert read() == "rotated" and read.sent == "rotated"
    path.unlink()
    assert read() == ""  # the server refuses an empty token and the client retries


def test_a_tokens_expiry_is_read_for_scheduling_only() -> None:
    assert token_expiry(encode({"sub": USER_KEY, "exp": 1234}, generate_seed())) == 1234
    assert token_expiry(encode({"sub": USER_KEY}, generate_seed())) is None
    assert token_expiry("garbage") is None and token_expiry("a.!!!.c") is None


def test_node_settings_with_a_token_file_connect_as_their_node(tmp_path: Path) -> None:
    settings = NodeSettings(
        nats_urls=("nats://nats:4222",), nats_token_file=tmp_path / "token", node_name="gpu-1.lab"
    )
    config = bus_config(settings, name="discovery", producer="discovery")
    assert config.user == "node-gpu-1_lab"
    assert config.token_file == str(tmp_path / "token")
    central = ServiceSettings(nats_urls=("nats://nats:4222",), nats_token_file=tmp_path / "token")
    with pytest.raises(ValueError, match="only node services"):
        bus_config(central, name="allocator", producer="allocator")
