"""NATS JWTs as nats-server reads and writes them: nkeys, user claims, auth callout messages.

A NATS JWT is `base64url(header) . base64url(claims) . base64url(signature)` with the header
`{"typ":"JWT","alg":"ed25519-nkey"}` and an Ed25519 signature over the first two parts by the
issuer's nkey. Claims carry `jti` (the base32 SHA-256 of the claims without it), `iat`, `iss`,
`sub`, an optional `aud`, `exp` and `name`, and the NATS part under `nats` with its `type` and
`version` (2).

The auth callout exchange (nats-server >= 2.10): the server publishes an
`authorization_request` it signed with its server nkey; the responder answers with an
`authorization_response`, signed by the callout issuer (an account nkey), that holds either a
user JWT (also signed by the issuer) or an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

from tangram.natsauth.permissions import Permissions

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
# The algorithm names nats-server accepts; v1 JWTs used "ed25519".
_ALGORITHMS = ("ed25519-nkey", "ed25519")
VERSION = 2
AUTH_REQUEST = "authorization_request"
AUTH_RESPONSE = "authorization_response"
USER = "user"


class NatsJwtError(ValueError):
    """A JWT or an nkey that is malformed, wrongly signed, of the wrong kind, or expired."""


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise NatsJwtError(f"not base64url: {exc}") from None


# Public nkeys: one prefix byte naming the role, 32 bytes of Ed25519 key, CRC-16, in base32.
_PREFIXES = {
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "server": nkeys.PREFIX_BYTE_SERVER,
    "user": nkeys.PREFIX_BYTE_USER,
}


def generate_seed(role: str = "account") -> str:
    """A fresh nkey seed (`SA...` for an account): the issuer of the callout's user JWTs."""
    return str(nkeys.encode_seed(os.urandom(32), _PREFIXES[role]).decode("ascii"))


def public_key_of(seed: str) -> str:
    try:
        return str(nkeys.from_seed(seed.encode("ascii")).public_key.decode("ascii"))
    except (nkeys.NkeysError, ValueError, binascii.Error) as exc:
        raise NatsJwtError(f"not an nkey seed: {exc}") from None


def _verify_key(public_key: str, role: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key inside a public nkey of `role`, its prefix and checksum checked."""
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except (binascii.Error, ValueError):
        raise NatsJwtError(f"{role} key {public_key[:8]}... is not base32") from None
    if len(raw) != 35 or raw[0] != _PREFIXES[role]:
        raise NatsJwtError(f"{public_key[:8]}... is not a {role} public key")
    body, checksum = raw[:-2], raw[-2:]
    if nkeys.crc16(bytearray(body)).to_bytes(2, "little") != checksum:
        raise NatsJwtError(f"{role} key {public_key[:8]}... fails its checksum")
    return nacl.signing.VerifyKey(bytes(body[1:]))


def _role_of(public_key: str) -> str:
    for role, prefix_char in (("account", "A"), ("server", "N"), ("user", "U")):
        if public_key.startswith(prefix_char):
            return role
    raise NatsJwtError(f"issuer {public_key[:8]}... is not an account, server or user key")


def encode(claims: Mapping[str, Any], seed: str) -> str:
    """Sign `claims` with the nkey `seed`: `iss` is set to its public key and `jti` computed."""
    try:
        pair = nkeys.from_seed(seed.encode("ascii"))
    except (nkeys.NkeysError, ValueError, binascii.Error) as exc:
        raise NatsJwtError(f"not an nkey seed: {exc}") from None
    body = {key: value for key, value in claims.items() if key != "jti"}
    body["iss"] = pair.public_key.decode("ascii")
    # The server's jwt library hashes the claims serialized without jti; any stable id will do.
    body["jti"] = (
        base64.b32encode(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest())
        .decode("ascii")
        .rstrip("=")
    )
    signing_input = f"{_b64encode(json.dumps(HEADER).encode())}.{_b64encode(json.dumps(body).encode())}"
    signature = pair.sign(signing_input.encode("ascii"))
    return f"{signing_input}.{_b64encode(signature)}"


def decode(token: str, *, now: float | None = None) -> dict[str, Any]:
    """The claims of a JWT whose signature verifies against its own issuer; not expired."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise NatsJwtError("a JWT has three dot-separated parts")
    try:
        header = json.loads(_b64decode(parts[0]))
        claims = json.loads(_b64decode(parts[1]))
    except ValueError as exc:
        raise NatsJwtError(f"JWT is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("alg") not in _ALGORITHMS:
        raise NatsJwtError(
            f"JWT algorithm {header.get('alg') if isinstance(header, dict) else None!r} is not an nkey one"
        )
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise NatsJwtError("JWT claims name no issuer")
    issuer = claims["iss"]
    key = _verify_key(issuer, _role_of(issuer))
    try:
        key.verify(f"{parts[0]}.{parts[1]}".encode("ascii"), _b64decode(parts[2]))
    except nacl.exceptions.BadSignatureError:
        raise NatsJwtError("JWT signature does not verify against its issuer") from None
    expires = claims.get("exp")
    if isinstance(expires, int) and expires and expires <= (time.time() if now is None else now):
        raise NatsJwtError("JWT has expired")
    return claims


@dataclass(frozen=True)
class AuthRequest:
    """What nats-server asks the callout about one connection."""

    server_id: str  # the server's public nkey: the response's audience
    user_nkey: str  # the connection's one-time user key: the user JWT's subject
    token: str | None  # connect option auth_token
    user: str | None  # connect option user
    password: str | None = None  # connect option pass
    client_host: str | None = None


def decode_auth_request(token: str, *, now: float | None = None) -> AuthRequest:
    """Decode and verify an authorization request: signed by a server key, for a user key."""
    claims = decode(token, now=now)
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != AUTH_REQUEST:
        raise NatsJwtError("not an authorization request")
    if _role_of(claims["iss"]) != "server":
        raise NatsJwtError("authorization request not signed by a server key")
    server = nats.get("server_id") or {}
    user_nkey = nats.get("user_nkey")
    if not isinstance(user_nkey, str) or not user_nkey.startswith("U"):
        raise NatsJwtError("authorization request names no user key")
    server_id = server.get("id") if isinstance(server, dict) else None
    if not isinstance(server_id, str) or server_id != claims["iss"]:
        raise NatsJwtError("authorization request's server id is not its signer")
    options = nats.get("connect_opts") or {}
    client = nats.get("client_info") or {}

    def text(value: object) -> str | None:
        return value if isinstance(value, str) and value else None

    return AuthRequest(
        server_id=server_id,
        user_nkey=user_nkey,
        token=text(options.get("auth_token")),
        user=text(options.get("user")),
        password=text(options.get("pass")),
        client_host=text(client.get("host")) if isinstance(client, dict) else None,
    )


def _permission(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if allow:
        out["allow"] = list(allow)
    if deny:
        out["deny"] = list(deny)
    return out


def user_claims(
    *,
    user_nkey: str,
    name: str,
    account: str,
    permissions: Permissions,
    issued_at: int,
    expires_at: int,
) -> dict[str, Any]:
    """A user JWT's claims: the connection's key, the account it joins, exactly these permissions."""
    return {
        "sub": user_nkey,
        "name": name,
        "aud": account,
        "iat": issued_at,
        "exp": expires_at,
        "nats": {
            "pub": _permission(permissions.publish_allow, permissions.publish_deny),
            "sub": _permission(permissions.subscribe_allow, permissions.subscribe_deny),
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": USER,
            "version": VERSION,
        },
    }


def permissions_of(claims: Mapping[str, Any]) -> Permissions:
    """The permissions a user JWT's claims carry (what the server will enforce)."""
    nats = claims.get("nats") or {}
    pub = nats.get("pub") or {}
    sub = nats.get("sub") or {}
    return Permissions(
        publish_allow=tuple(pub.get("allow") or ()),
        subscribe_allow=tuple(sub.get("allow") or ()),
        publish_deny=tuple(pub.get("deny") or ()),
        subscribe_deny=tuple(sub.get("deny") or ()),
    )


def auth_response(
    request: AuthRequest,
    seed: str,
    *,
    user_jwt: str | None = None,
    error: str | None = None,
    now: int | None = None,
) -> str:
    """The signed answer to `request`: a user JWT, or an error (the connection is then refused)."""
    if (user_jwt is None) == (error is None):
        raise ValueError("an authorization response carries a user JWT or an error, not both")
    issued = int(time.time()) if now is None else now
    nats: dict[str, Any] = {"type": AUTH_RESPONSE, "version": VERSION}
    if user_jwt is not None:
        nats["jwt"] = user_jwt
    else:
        nats["error"] = error
    claims = {"sub": request.user_nkey, "aud": request.server_id, "iat": issued, "nats": nats}
    return encode(claims, seed)
