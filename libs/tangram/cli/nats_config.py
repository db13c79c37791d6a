"""`tangram nats-config`: nats-server users with per-node permissions, and each user's credentials.

Writes the server config (a whole config, or only the authorization block) and, per user,
`<user>.password` and `<user>.url` (the NATS URL with user and password, what a service takes as
TANGRAM_NATS_URL), all with mode 0600. Existing password files are reused, so adding a node
does not change anyone else's password. Passwords are never printed: without `--out` nothing is
written and the command says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tangram.natsauth import (
    NatsAuthError,
    TlsFiles,
    build_users,
    read_password_file,
    render_server_config,
    render_users,
    user_names,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", action="append", default=[], required=True, help="a node name; repeatable")
    parser.add_argument(
        "--out", type=Path, help="server config file to write (required: it holds every password)"
    )
    parser.add_argument(
        "--credentials-dir",
        type=Path,
        default=Path("nats-credentials"),
        help="where <user>.password and <user>.url are read and written (default ./nats-credentials)",
    )
    parser.add_argument(
        "--server-url", default="nats://nats:4222", help="server URL written into <user>.url files"
    )
    parser.add_argument(
        "--block-only", action="store_true", help="write only the authorization block, not a whole config"
    )
    parser.add_argument("--store-dir", default="/data/jetstream", help="JetStream store dir in the config")
    parser.add_argument("--tls-cert", type=Path, help="server certificate (enables TLS)")
    parser.add_argument("--tls-key", type=Path, help="server key")
    parser.add_argument("--tls-ca", type=Path, help="CA of client certificates")
    parser.add_argument("--tls-verify", action="store_true", help="require client certificates")


def write_secret(path: Path, text: str) -> None:
    """Atomically write a file readable by its owner only (0600), even for an instant."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def user_url(server_url: str, user: str, password: str) -> str:
    parts = urlsplit(server_url)
    if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
        raise NatsAuthError(f"{server_url!r} is not a NATS URL (nats://host:port)")
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}{port}"))


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_ca is not None or args.tls_verify:
            raise NatsAuthError("--tls-ca and --tls-verify need --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise NatsAuthError("TLS needs both --tls-cert and --tls-key")
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_verify)


def run(args: argparse.Namespace) -> int:
    try:
        if args.out is None:
            # The config holds every user's password: it goes to a 0600 file, never to a terminal or log.
            raise NatsAuthError(
                "--out FILE is required: the server config holds passwords, so it is only written to a file"
            )
        tls = _tls(args)
        names = user_names(args.node)
        existing = {
            name: read_password_file(name, path)
            for name in names
            if (path := args.credentials_dir / f"{name}.password").exists()
        }
        users = build_users(args.node, existing)
        urls = {user.name: user_url(args.server_url, user.name, user.password) for user in users}
    except NatsAuthError as exc:
        print(f"tangram nats-config: {exc}", file=sys.stderr)
        return 2
    if args.block_only:
        config = render_users(users)
    else:
        config = render_server_config(users, store_dir=args.store_dir, tls=tls)
    written: list[Path] = []
    for user in users:
        for suffix, text in ((".password", user.password), (".url", urls[user.name])):
            path = args.credentials_dir / f"{user.name}{suffix}"
            write_secret(path, text + "\n")
            written.append(path)
    write_secret(args.out, config)
    written.append(args.out)
    reused = len(existing)
    print(
        f"wrote {len(written)} files ({len(users)} users, {reused} existing passwords kept): "
        + ", ".join(str(p) for p in written),
        file=sys.stderr,
    )
    return 0
