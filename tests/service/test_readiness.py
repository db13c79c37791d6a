"""/readyz answers 503 with the reason while a service cannot work, and 200 again once it can."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.msg import Msg

from tangram.bus import Bus, BusConfig
from tangram.local.natsserver import NatsServer
from tangram.natsauth.jwt import (
    auth_response,
    decode_auth_request,
    encode,
    generate_seed,
    public_key_of,
    user_claims,
)
from tangram.natsauth.permissions import (
    ADMIN_USER,
    AUTH_SUBJECT,
    CALLOUT_USER,
    TANGRAM_ACCOUNT,
    build_callout_users,
    inbox,
    node_permissions,
    node_user,
    render_callout_authorization,
)
from tangram.service import ServiceContext
from tangram.service.runner import serve
from tangram.service.settings import NodeSettings, ServiceSettings
from tests.service.readiness import readyz, until_readyz


async def run_service(settings: ServiceSettings, body: Callable[[ServiceContext], Awaitable[None]]) -> int:
    async def main(ctx: ServiceContext) -> None:
        try:
            await body(ctx)
        finally:
            ctx.stop.set()

    return await serve("probe", "probe@test", settings, main)


async def test_nats_unreachable_makes_the_service_unready_until_it_is_back(nats_server: NatsServer) -> None:
    settings = ServiceSettings(nats_urls=(nats_server.url,))

    async def body(ctx: ServiceContext) -> None:
        status, answer = await readyz(ctx.health_port)
        assert (status, answer) == (503, {"ready": False, "reasons": ["service is starting"]})
        ctx.ready.set()
        assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}
        await asyncio.to_thread(nats_server.stop)
        down = await until_readyz(ctx.health_port, 503)
        assert down == {"ready": False, "reasons": ["NATS is unreachable (reconnecting)"]}
        await asyncio.to_thread(nats_server.start)  # the same port: the client reconnects by itself
        assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}

    assert await run_service(settings, body) == 0


async def test_a_services_own_check_names_its_reason(nats_server: NatsServer) -> None:
    settings = ServiceSettings(nats_urls=(nats_server.url,))
    problem: list[str] = ["kubelet refused the plugin registration: wrong version"]

    async def body(ctx: ServiceContext) -> None:
        ctx.readiness.append(lambda: problem[0] if problem else None)
        ctx.ready.set()
        down = await until_readyz(ctx.health_port, 503)
        assert down["reasons"] == ["kubelet refused the plugin registration: wrong version"]
        problem.clear()
        assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}

    assert await run_service(settings, body) == 0


async def test_a_connection_the_server_ends_for_good_stops_the_service(tmp_path: Path) -> None:
    """nats-py does not reopen a connection the server closed with an error, as nats-server does
    when a user issued by the auth callout expires (its token not rotated in time). The service
    exits non-zero instead of staying unready forever, so that a restart connects afresh.

    The callout here is a stand-in that issues node gpu-1's user for two seconds."""
    seed = generate_seed()
    users = build_callout_users()
    passwords = {user.name: user.password for user in users}
    config = tmp_path / "nats.conf"
    config.write_text(render_callout_authorization(users, public_key_of(seed)))
    server = NatsServer(tmp_path / "store", config_file=config).start()

    def url(user: str) -> str:
        return f"nats://{user}:{passwords[user]}@127.0.0.1:{server.port}"

    async def issue(msg: Msg) -> None:
        request = decode_auth_request(msg.data.decode())
        now = int(time.time())
        claims = user_claims(
            user_nkey=request.user_nkey,
            name=node_user("gpu-1"),
            account=TANGRAM_ACCOUNT,
            permissions=node_permissions("gpu-1"),
            issued_at=now,
            expires_at=now + 2,
        )
        await msg.respond(auth_response(request, seed, user_jwt=encode(claims, seed)).encode())

    callout = await nats.connect(url(CALLOUT_USER), inbox_prefix=inbox(CALLOUT_USER))
    try:
        await callout.subscribe(AUTH_SUBJECT, cb=issue)
        await callout.flush()
        admin = await Bus.connect(BusConfig(servers=(url(ADMIN_USER),), name="a", producer="a"), wait_s=30)
        await admin.ensure_streams()
        await admin.close()
        token = tmp_path / "token"
        token.write_text("a token the stand-in does not read")
        settings = NodeSettings(nats_urls=(server.url,), nats_token_file=token, node_name="gpu-1")
        stopped_by_itself = asyncio.Event()

        async def main(ctx: ServiceContext) -> None:
            ctx.ready.set()
            await asyncio.wait_for(ctx.stop.wait(), 30)
            stopped_by_itself.set()

        assert await serve("probe", "probe@test", settings, main) == 1
        assert stopped_by_itself.is_set()
    finally:
        await callout.close()
        server.stop()
