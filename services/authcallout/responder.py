"""Answers nats-server's authorization requests for node services.

Each request carries the connecting client's token; the answer is a user JWT named
`node-<node>` with `tangram.natsauth.node_permissions` of the node the token is bound to, in
Tangram's account, expiring with the token. A token that does not expire, or lives longer than
`max_ttl_s`, is refused: a user lives no longer than that (so a node added since is denied to the
others' users at their next connection, and a node's identity ends within that time of its pod's).
The client reconnects with its rotated token before the user expires (`tangram.bus`). Anything
else is answered with an error, which nats-server turns into a refused connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from services.authcallout.identity import NodeIdentity, Refused
from tangram.kubernetes.api import KubeApiError
from tangram.natsauth.jwt import (
    AuthRequest,
    NatsJwtError,
    auth_response,
    decode_auth_request,
    encode,
    user_claims,
)
from tangram.natsauth.permissions import TANGRAM_ACCOUNT, NatsAuthError, node_permissions, node_user

log = logging.getLogger("tangram.authcallout")

AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE = "tangram-authcallout"


class Reviewer(Protocol):
    async def review(self, token: str) -> NodeIdentity: ...

    async def nodes(self) -> list[str]: ...


class CalloutResponder:
    def __init__(
        self,
        reviewer: Reviewer,
        issuer_seed: str,
        *,
        account: str = TANGRAM_ACCOUNT,
        max_ttl_s: int = 3600,
    ) -> None:
        self._reviewer = reviewer
        self._seed = issuer_seed
        self.account = account
        self.max_ttl_s = max_ttl_s

    async def answer(self, request_jwt: str) -> str | None:
        """The signed response to one request; None when the request itself is not a valid one."""
        try:
            request = decode_auth_request(request_jwt)
        except NatsJwtError as exc:
            log.warning("malformed authorization request ignored", extra={"error": str(exc)})
            return None
        now = int(time.time())
        try:
            user_jwt = await self._authorize(request, now)
        except Refused as exc:
            log.info(
                "connection refused", extra={"reason": str(exc), "client": request.client_host or "unknown"}
            )
            return auth_response(request, self._seed, error=str(exc), now=now)
        return auth_response(request, self._seed, user_jwt=user_jwt, now=now)

    async def _authorize(self, request: AuthRequest, now: int) -> str:
        token = request.token or request.password
        if token is None:
            raise Refused("no token: node services connect with their service-account token")
        identity = await self._reviewer.review(token)
        if identity.expires_at is None:
            raise Refused("token does not expire: project one with expirationSeconds")
        if identity.expires_at - now > self.max_ttl_s:
            raise Refused(
                f"token lives longer than {self.max_ttl_s}s: project it with a shorter expirationSeconds"
            )
        try:
            others = [node for node in await self._reviewer.nodes() if node != identity.node]
            permissions = node_permissions(identity.node, others)
            name = node_user(identity.node)
        except (KubeApiError, NatsAuthError) as exc:  # an unlistable fleet, an unusable node name
            raise Refused(f"no permissions for node {identity.node!r}: {exc}") from None
        claims = user_claims(
            user_nkey=request.user_nkey,
            name=name,
            account=self.account,
            permissions=permissions,
            issued_at=now,
            expires_at=identity.expires_at,
        )
        log.info("node identity granted", extra={"user": name, "pod": f"{identity.namespace}/{identity.pod}"})
        return encode(claims, self._seed)

    async def _on_request(self, msg: Msg) -> None:
        response = await self.answer(msg.data.decode("utf-8", errors="replace"))
        if response is not None and msg.reply:
            await msg.respond(response.encode("ascii"))

    async def serve(self, nc: NatsClient, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Answer requests until `stop`; replicas share the load through one queue group. `ready`
        is set once the server knows of the subscription."""
        sub = await nc.subscribe(AUTH_SUBJECT, queue=QUEUE, cb=self._on_request)
        await nc.flush()
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            await sub.unsubscribe()
