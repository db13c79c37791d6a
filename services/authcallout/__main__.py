"""python -m services.authcallout: the NATS auth callout for node services.

Connects to NATS as the callout's static user (its URL read from a file), to Kubernetes as its
own service account, and answers authorization requests until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
from pathlib import Path

import nats

from services.authcallout.identity import TokenReviewer
from services.authcallout.responder import CalloutResponder
from tangram.bus import redact_url
from tangram.kubernetes.api import KubeConfigError, connect
from tangram.natsauth.jwt import NatsJwtError, public_key_of
from tangram.natsauth.permissions import CALLOUT_USER, inbox
from tangram.service.health import HealthServer
from tangram.service.logs import configure_logging

DEFAULT_AUDIENCE = "tangram-nats"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TANGRAM_{name}", default)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.authcallout", description=__doc__)
    parser.add_argument(
        "--nats-url-file",
        type=Path,
        default=_env("NATS_URL_FILE"),
        help="file holding the callout user's NATS URL (env TANGRAM_NATS_URL_FILE)",
    )
    parser.add_argument(
        "--nats-tls-ca",
        type=Path,
        default=_env("NATS_TLS_CA"),
        help="CA that signed the NATS servers' certificates, for a tls:// URL (env TANGRAM_NATS_TLS_CA)",
    )
    parser.add_argument(
        "--issuer-seed-file",
        type=Path,
        default=_env("CALLOUT_ISSUER_SEED_FILE"),
        help="file holding the account nkey seed (SA...) that signs user JWTs",
    )
    parser.add_argument(
        "--audience",
        default=_env("CALLOUT_AUDIENCE", DEFAULT_AUDIENCE),
        help=f"audience of the node services' projected tokens (default {DEFAULT_AUDIENCE})",
    )
    parser.add_argument(
        "--service-account",
        action="append",
        help="namespace:name of the node services' service account; repeatable "
        "(env TANGRAM_CALLOUT_SERVICE_ACCOUNTS, comma-separated; default tangram:tangram-node)",
    )
    parser.add_argument("--max-ttl", type=int, default=int(_env("CALLOUT_MAX_TTL_S", "3600") or 3600))
    parser.add_argument(
        "--kubeconfig", type=Path, default=None, help="default: in-cluster, else ~/.kube/config"
    )
    parser.add_argument("--health-host", default=_env("HEALTH_HOST", "127.0.0.1"))
    parser.add_argument(
        "--health-port",
        type=int,
        default=int(_env("HEALTH_PORT", "0") or 0),
        help="/healthz and /readyz port",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    if not args.service_account:
        given = _env("CALLOUT_SERVICE_ACCOUNTS") or "tangram:tangram-node"
        args.service_account = [account for account in given.split(",") if account]
    return args


def _read(path: Path | None, what: str) -> str:
    if path is None:
        raise SystemExit(f"tangram authcallout: {what} is required")
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SystemExit(f"tangram authcallout: cannot read {what} {path}: {exc.strerror}") from None


def nats_tls(ca: Path | None) -> ssl.SSLContext | None:
    """The context that verifies a tls:// NATS server against `ca`; None: the default (system CAs)."""
    if ca is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"tangram authcallout: cannot load the NATS CA {ca}: {exc}") from None


async def run(args: argparse.Namespace) -> int:
    url = _read(args.nats_url_file, "--nats-url-file")
    seed = _read(args.issuer_seed_file, "--issuer-seed-file")
    try:
        public_key_of(seed)
    except NatsJwtError as exc:
        raise SystemExit(f"tangram authcallout: issuer seed: {exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        api = await connect(kubeconfig=args.kubeconfig)
    except KubeConfigError as exc:
        raise SystemExit(f"tangram authcallout: {exc}") from None
    try:
        accounts = frozenset(args.service_account)
        reviewer = TokenReviewer(api, audience=args.audience, service_accounts=accounts)
        responder = CalloutResponder(reviewer, seed, max_ttl_s=args.max_ttl)
        lost = asyncio.Event()

        async def closed() -> None:
            if not stop.is_set():  # the server ended the connection for good: exit, be restarted
                lost.set()
                stop.set()

        nc = await nats.connect(
            url,
            tls=nats_tls(args.nats_tls_ca),
            name="tangram-authcallout",
            inbox_prefix=inbox(CALLOUT_USER),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            closed_cb=closed,
        )
        ready = asyncio.Event()
        health = HealthServer(
            args.health_host,
            args.health_port,
            ready.is_set,
            [lambda: None if nc.is_connected else "NATS is unreachable (reconnecting)"],
        )
        await health.start()
        try:
            print(
                f"tangram authcallout: answering on {redact_url(url)}, health on port {health.port}",
                file=sys.stderr,
                flush=True,
            )
            await responder.serve(nc, stop, ready)
        finally:
            await health.stop()
            if not nc.is_closed:
                await nc.close()
    finally:
        await api.close()
    return 1 if lost.is_set() else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("authcallout", args.log_level)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
