"""`tangram nats-config`: nats-server users with per-node permissions, and each user's credentials.

Writes the server config (a whole config, or only the authorization block) and, per user,
`<user>.password` and `<user>.url` (the NATS URL with user and password, what a service takes as
TANGRAM_NATS_URL), all with mode 0600. Existing password files are reused, so adding a node
does not change anyone else's password. Passwords are never printed: without `--out` nothing is
written and the command says so.

With `--callout`, no node is listed: the config hands every connection but admin, allocator and
the callout's own user to the auth callout (`python -m services.authcallout`), which issues each
node's user from its pod's service-account token. The callout's issuer seed is written (or
reused) as `callout-issuer.seed`; its public key is in the config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tangram.natsauth.credentials import user_url, write_secret
from tangram.natsauth.permissions import (
    ADMIN_USER,
    ALLOCATOR_USER,
    CALLOUT_USER,
    NatsAuthError,
    NatsUser,
    TlsFiles,
    build_callout_users,
    build_users,
    read_password_file,
    render_callout_authorization,
    render_callout_server_config,
    render_server_config,
    render_users,
    user_names,
)

ISSUER_SEED = "callout-issuer.seed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", action="append", default=[], help="a node name; repeatable")
    parser.add_argument(
        "--callout",
        action="store_true",
        help="node users come from the auth callout (pods' service-account tokens): list no node",
    )
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


def _issuer_seed(directory: Path) -> str:
    """The callout's issuer seed, kept across runs: a new one would void every issued user."""
    from tangram.natsauth.jwt import NatsJwtError, generate_seed, public_key_of  # noqa: PLC0415 - nkeys, only with --callout

    path = directory / ISSUER_SEED
    if not path.exists():
        return generate_seed()
    try:
        seed = path.read_text(encoding="utf-8").strip()
        public_key_of(seed)
    except OSError as exc:
        raise NatsAuthError(f"{path} cannot be read: {exc.strerror}") from None
    except NatsJwtError:
        raise NatsAuthError(f"{path} is not an nkey seed") from None
    if not seed.startswith("SA"):
        raise NatsAuthError(f"{path} is not an account nkey seed (SA...)")
    return seed


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_ca is not None or args.tls_verify:
            raise NatsAuthError("--tls-ca and --tls-verify need --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise NatsAuthError("TLS needs both --tls-cert and --tls-key")
    if args.tls_verify and args.tls_ca is None:
        raise NatsAuthError("--tls-verify needs --tls-ca: the CA that signs the client certificates")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-ca", args.tls_ca)):
        if path is not None and not path.is_file():
            raise NatsAuthError(f"{flag} {path}: no such file (nats-server would not start)")
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_verify)


def run(args: argparse.Namespace) -> int:
    try:
        if args.out is None:
            # The config holds every user's password: it goes to a 0600 file, never to a terminal or log.
            raise NatsAuthError(
                "--out FILE is required: the server config holds passwords, so it is only written to a file"
            )
        if args.out.is_dir():
            raise NatsAuthError(f"--out {args.out} is a directory; name the config file to write")
        tls = _tls(args)
        if args.callout:
            if args.node:
                raise NatsAuthError("--callout issues node users from tokens: list no --node")
            names = [ADMIN_USER, ALLOCATOR_USER, CALLOUT_USER]
        elif not args.node:
            raise NatsAuthError("name the fleet's nodes with --node (or let the auth callout: --callout)")
        else:
            names = user_names(args.node)
        existing = {
            name: read_password_file(name, path)
            for name in names
            if (path := args.credentials_dir / f"{name}.password").exists()
        }
        seed = _issuer_seed(args.credentials_dir) if args.callout else None
        users: list[NatsUser] = (
            build_callout_users(existing) if args.callout else build_users(args.node, existing)
        )
        urls = {user.name: user_url(args.server_url, user.name, user.password) for user in users}
        if seed is not None:
            from tangram.natsauth.jwt import public_key_of  # noqa: PLC0415 - nkeys, only with --callout

            issuer = public_key_of(seed)
            if args.block_only:
                config = render_callout_authorization(users, issuer)
            else:
                config = render_callout_server_config(users, issuer, store_dir=args.store_dir, tls=tls)
        elif args.block_only:
            config = render_users(users)
        else:
            config = render_server_config(users, store_dir=args.store_dir, tls=tls)
    except NatsAuthError as exc:
        print(f"tangram nats-config: {exc}", file=sys.stderr)
        return 2
    written: list[Path] = []
    try:
        if seed is not None:
            write_secret(args.credentials_dir / ISSUER_SEED, seed + "\n")
            written.append(args.credentials_dir / ISSUER_SEED)
        for user in users:
            for suffix, text in ((".password", user.password), (".url", urls[user.name])):
                path = args.credentials_dir / f"{user.name}{suffix}"
                write_secret(path, text + "\n")
                written.append(path)
        write_secret(args.out, config)
        written.append(args.out)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else args.credentials_dir
        print(f"tangram nats-config: cannot write {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    reused = len(existing)
    print(
        f"wrote {len(written)} files ({len(users)} users, {reused} existing passwords kept): "
        + ", ".join(str(p) for p in written),
        file=sys.stderr,
    )
    return 0
