"""Authorization requests as nats-server sends them to the auth callout, signed by a server key."""

from __future__ import annotations

import time

from tangram.natsauth.jwt import AUTH_REQUEST, encode, generate_seed, public_key_of

SERVER_SEED = generate_seed("server")
USER_KEY = public_key_of(generate_seed("user"))


def request_jwt(options: dict[str, object], *, seed: str = SERVER_SEED, server_id: str | None = None) -> str:
    return encode(
        {
            "sub": "auth-callout",
            "iat": int(time.time()),
            "nats": {
                "type": AUTH_REQUEST,
                "version": 2,
                "server_id": {"id": server_id or public_key_of(seed), "name": "nats-0"},
                "user_nkey": USER_KEY,
                "connect_opts": options,
                "client_info": {"host": "10.0.0.7"},
            },
        },
        seed,
    )
