"""nats-server authorization for Tangram: one user per service role, each limited to its subjects.

Roles:
- `admin` manages the streams (create/update) and nothing else is expected to.
- `allocator` publishes claim decisions and partition commands, consumes claims, partition
  results, prepared claims and inventories, replays the log at start, and alone writes and reads
  its ledger image.
- `node-<token>` (discovery, partitioner and cdi of one node) publishes only that node's
  inventory, results, dead letters and (cdi, for claims kube-scheduler allocated) partition
  commands, consumes only that node's partition commands through its own durable, and follows
  claim decisions.

JetStream is driven through subjects too, so the permissions also name the JetStream API calls
each role makes: stream info, creation of its own durables (by name) and of ephemeral consumers
on the streams it reads, pulls and acks on its own durables only, flow-control replies of the
streams it follows. Anything not allowed is refused by the server.

Passwords are generated with `secrets` or read from files; this module never logs them.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tangram.bus.declarations import (
    IMAGE_BUCKET,
    LEADER_BUCKET,
    allocator_consumer,
    allocator_node_subjects,
    allocator_results_consumer,
    node_partition_subjects,
    node_prepare_subjects,
    partitioner_consumer,
)
from tangram.events import (
    CLAIMS_STREAM,
    DEADLETTER_STREAM,
    INVENTORY_STREAM,
    NODES_STREAM,
    InvalidKey,
    subject_token,
)

ADMIN_USER = "admin"
ALLOCATOR_USER = "allocator"
# The auth callout's own user (`services.authcallout`), and the account every Tangram user is in
# when the callout issues the node users (a callout needs a named account; see
# `render_callout_server_config`).
CALLOUT_USER = "authcallout"
TANGRAM_ACCOUNT = "TANGRAM"
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
ALL_STREAMS = (INVENTORY_STREAM, CLAIMS_STREAM, NODES_STREAM, DEADLETTER_STREAM)

# What a password may contain: the nats-server config and a NATS URL both take it unescaped.
_PASSWORD = re.compile(r"^[A-Za-z0-9._~-]{16,256}$")


class NatsAuthError(ValueError):
    """Bad input to the authorization generator: a node name, a password, a duplicate."""


@dataclass(frozen=True)
class Permissions:
    publish_allow: tuple[str, ...]
    subscribe_allow: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()
    # may publish to the reply subject of a request it received (the callout answering the server)
    allow_responses: bool = False


@dataclass(frozen=True)
class NatsUser:
    name: str
    password: str = field(repr=False)
    permissions: Permissions


@dataclass(frozen=True)
class TlsFiles:
    """Server-side TLS: certificate, key and, to verify client certificates, a CA."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    verify_clients: bool = False


def node_user(node: str) -> str:
    """The NATS user of a node's services: `node-<subject token>`."""
    try:
        return f"node-{subject_token(node)}"
    except InvalidKey as exc:
        raise NatsAuthError(f"node {node!r}: {exc}") from None


def inbox(user: str) -> str:
    """Where a user's replies arrive; its connections set `inbox_prefix` to this (tangram.bus does)."""
    return f"_INBOX_{user}"


def _durable_api(stream: str, durable: str, filters: Sequence[str]) -> list[str]:
    """Create (only with its own filter, when it has one), inspect, pull from and ack one durable."""
    create = f"$JS.API.CONSUMER.CREATE.{stream}.{durable}"
    return [
        f"{create}.{filters[0]}" if len(filters) == 1 else create,
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _follow_api(stream: str, filters: Sequence[str]) -> list[str]:
    """Short-lived named push consumers (follow, replay): created only with these filters
    (() means the whole stream), deleted when done; flow-control replies.

    The name is a wildcard (`<user>-<random>` by convention); what keeps a user off the durables
    of others is the deny list built by `_not_yours`.
    """
    creates = [f"$JS.API.CONSUMER.CREATE.{stream}.*.{f}" for f in filters] or [
        f"$JS.API.CONSUMER.CREATE.{stream}.*"
    ]
    return [*creates, f"$JS.API.CONSUMER.DELETE.{stream}.*", f"$JS.FC.{stream}.>"]


def _multi_filter_api(stream: str) -> list[str]:
    """A named consumer with several filters: the create subject cannot carry them."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.*",
        f"$JS.API.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _not_yours(durables: Iterable[tuple[str, str]]) -> list[str]:
    """Every API call naming another role's durable: a create would rewrite its filter (a hijack),
    an info, pull, ack or delete would read or steal its messages."""
    denied: list[str] = []
    for stream, durable in durables:
        denied += [
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>",
        ]
    return denied


def _lease_api(role: str) -> list[str]:
    """Hold the leader lease of one role: bind the bucket, read, create, renew, release the key."""
    bucket = LEADER_BUCKET.bucket
    return [
        f"$JS.API.STREAM.INFO.KV_{bucket}",
        f"$KV.{bucket}.{role}",
        f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{role}",
        f"$JS.API.STREAM.MSG.GET.KV_{bucket}",
    ]


def _image_api() -> list[str]:
    """Write and read the allocator's ledger image (an object store): publish its chunks and its
    entry, purge the chunks it replaces, read its entry, and read the chunks back through a
    short-lived consumer filtered to them."""
    bucket = IMAGE_BUCKET.bucket
    stream = f"OBJ_{bucket}"
    return [
        f"$O.{bucket}.>",
        f"$JS.API.STREAM.PURGE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        *_follow_api(stream, (f"$O.{bucket}.C.*",)),
    ]


def _stream_info() -> list[str]:
    # Every service checks at start that the streams and buckets exist as declared (the information
    # of a stream, never its content).
    streams = [*ALL_STREAMS, f"KV_{LEADER_BUCKET.bucket}", f"OBJ_{IMAGE_BUCKET.bucket}"]
    return [f"$JS.API.STREAM.INFO.{stream}" for stream in streams]


def _unique(subjects: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(subjects))


# Replies go to each user's own inbox prefix; the shared default one is nobody's.
_SHARED_INBOX = "_INBOX.>"


def admin_permissions() -> Permissions:
    return Permissions(
        publish_allow=("$JS.API.>",),
        subscribe_allow=(f"{inbox(ADMIN_USER)}.>",),
        subscribe_deny=(_SHARED_INBOX,),
    )


def _central_durables() -> list[tuple[str, str]]:
    return [(spec.stream, spec.durable) for spec in (allocator_consumer(), allocator_results_consumer())]


def allocator_permissions(nodes: Sequence[str] = ()) -> Permissions:
    """The allocator: decides claims, commands partitions, replays the whole log at start.

    `nodes` name the partitioner durables it must not touch.
    """
    claims = allocator_consumer()
    results = allocator_results_consumer()
    publish = [
        "tangram.claim.*.*",
        "tangram.node.*.partition.requested",
        f"tangram.deadletter.{subject_token(claims.durable)}",
        f"tangram.deadletter.{subject_token(results.durable)}",
        f"tangram.deadletter.{ALLOCATOR_USER}-follow",
        *_stream_info(),
        *_durable_api(claims.stream, claims.durable, claims.filter_subjects),
        *_durable_api(results.stream, results.durable, results.filter_subjects),
        *_follow_api(INVENTORY_STREAM, ()),
        *_follow_api(INVENTORY_STREAM, ("tangram.inventory.>",)),
        *_follow_api(CLAIMS_STREAM, ()),
        *_follow_api(NODES_STREAM, allocator_node_subjects()),
        *_multi_filter_api(NODES_STREAM),
        *_lease_api(ALLOCATOR_USER),
        *_image_api(),
    ]
    deny = _not_yours((NODES_STREAM, partitioner_consumer(node).durable) for node in nodes)
    return Permissions(
        publish_allow=_unique(publish),
        subscribe_allow=(f"{inbox(ALLOCATOR_USER)}.>",),
        publish_deny=_unique(deny),
        subscribe_deny=(_SHARED_INBOX,),
    )


def node_permissions(node: str, others: Sequence[str] = ()) -> Permissions:
    """A node's services: their own node's subjects only. `others` are the fleet's other nodes.

    They publish the node's inventory, results, prepared claims, health and (cdi, for claims
    kube-scheduler allocated) its own partition commands; consume the node's
    partition commands through its own durable; follow the claim decisions (a claim's subject
    names its uid, not its node), their own inventory, partition subjects and prepared claims.
    """
    token = subject_token(node)
    user = node_user(node)
    durable = partitioner_consumer(node)
    publish = [
        f"tangram.inventory.{token}",
        f"tangram.node.{token}.>",
        f"tangram.deadletter.{subject_token(durable.durable)}",
        f"tangram.deadletter.{user}-follow",
        *_stream_info(),
        *_durable_api(NODES_STREAM, durable.durable, durable.filter_subjects),
        *_follow_api(INVENTORY_STREAM, (f"tangram.inventory.{token}",)),
        *_follow_api(NODES_STREAM, (node_partition_subjects(node), node_prepare_subjects(node))),
        *_multi_filter_api(CLAIMS_STREAM),
    ]
    # The node's own partition commands are allowed by `tangram.node.<token>.>`: its cdi service
    # sends its partitioner the commands of claims kube-scheduler allocated (a node holds its GPUs
    # through NVML anyway). Another node's commands are not: nor anybody else's durables.
    others_durables = [
        (NODES_STREAM, partitioner_consumer(other).durable)
        for other in others
        if partitioner_consumer(other).durable != durable.durable
    ]
    deny = _not_yours([*_central_durables(), *others_durables])
    return Permissions(
        publish_allow=_unique(publish),
        subscribe_allow=(f"{inbox(user)}.>",),
        publish_deny=_unique(deny),
        subscribe_deny=(_SHARED_INBOX,),
    )


def callout_permissions() -> Permissions:
    """The auth callout: receives the server's authorization requests and answers them, nothing else."""
    return Permissions(
        publish_allow=(),
        subscribe_allow=(AUTH_SUBJECT,),
        subscribe_deny=(_SHARED_INBOX,),
        allow_responses=True,
    )


def user_names(nodes: Sequence[str]) -> list[str]:
    """Every user of a fleet, admin first; raises NatsAuthError on a bad or duplicate node."""
    names = [ADMIN_USER, ALLOCATOR_USER]
    for node in nodes:
        name = node_user(node)
        if name in names:
            raise NatsAuthError(f"node {node!r} is listed twice (or maps to the same subject token)")
        names.append(name)
    return names


def check_password(user: str, password: str) -> str:
    if not _PASSWORD.match(password):
        raise NatsAuthError(
            f"password of user {user!r} must be 16-256 characters of A-Z a-z 0-9 . _ ~ - "
            "(it is written unescaped into the server config and the NATS URL)"
        )
    return password


def generate_password() -> str:
    return secrets.token_urlsafe(32)


def read_password_file(user: str, path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NatsAuthError(f"password file of user {user!r} cannot be read: {exc.strerror}") from None
    return check_password(user, text.strip())


def build_users(nodes: Sequence[str], passwords: Mapping[str, str] | None = None) -> list[NatsUser]:
    """The users of a fleet; a user without a given password gets a fresh random one."""
    given = dict(passwords or {})
    names = user_names(nodes)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise NatsAuthError(f"passwords given for unknown users: {', '.join(unknown)}")
    users = [
        NatsUser(
            ADMIN_USER,
            check_password(ADMIN_USER, given.get(ADMIN_USER) or generate_password()),
            admin_permissions(),
        ),
        NatsUser(
            ALLOCATOR_USER,
            check_password(ALLOCATOR_USER, given.get(ALLOCATOR_USER) or generate_password()),
            allocator_permissions(nodes),
        ),
    ]
    for node in nodes:
        name = node_user(node)
        others = [n for n in nodes if n != node]
        password = check_password(name, given.get(name) or generate_password())
        users.append(NatsUser(name, password, node_permissions(node, others)))
    return users


def _quoted(value: str) -> str:
    return json.dumps(value)


def _subject_list(subjects: Sequence[str]) -> str:
    return "[" + ", ".join(_quoted(s) for s in subjects) + "]"


def _render_user(user: NatsUser) -> list[str]:
    perms = user.permissions
    lines = [
        "    {",
        f"      user: {_quoted(user.name)}",
        f"      password: {_quoted(user.password)}",
        "      permissions: {",
        "        publish: {",
        f"          allow: {_subject_list(perms.publish_allow)}",
    ]
    if perms.publish_deny:
        lines.append(f"          deny: {_subject_list(perms.publish_deny)}")
    lines += ["        }", "        subscribe: {", f"          allow: {_subject_list(perms.subscribe_allow)}"]
    if perms.subscribe_deny:
        lines.append(f"          deny: {_subject_list(perms.subscribe_deny)}")
    lines.append("        }")
    if perms.allow_responses:
        lines.append("        allow_responses: true")
    lines += ["      }", "    }"]
    return lines


def render_users(users: Sequence[NatsUser]) -> str:
    """The `authorization { users: [...] }` block of a nats-server config."""
    lines = ["authorization {", "  users: ["]
    for user in users:
        lines += _render_user(user)
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def _render_tls(tls: TlsFiles) -> str:
    lines = [
        "tls {",
        f"  cert_file: {_quoted(str(tls.cert_file))}",
        f"  key_file: {_quoted(str(tls.key_file))}",
    ]
    if tls.ca_file is not None:
        lines.append(f"  ca_file: {_quoted(str(tls.ca_file))}")
    if tls.verify_clients:
        if tls.ca_file is None:
            raise NatsAuthError("verifying client certificates needs a CA file")
        lines.append("  verify: true")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_authorization(
    nodes: Sequence[str],
    *,
    passwords: Mapping[str, str] | None = None,
    tls: TlsFiles | None = None,
) -> str:
    """The authorization block (and a `tls` block when given) for a fleet's nodes.

    Users without a password in `passwords` get a random one, which is then only in the returned
    text: use `build_users` + `render_users` to keep the passwords too.
    """
    text = render_users(build_users(nodes, passwords))
    return (_render_tls(tls) + text) if tls is not None else text


def render_server_config(
    users: Sequence[NatsUser],
    *,
    store_dir: str = "/data/jetstream",
    port: int = 4222,
    monitor_port: int | None = 8222,
    tls: TlsFiles | None = None,
) -> str:
    """A whole nats-server config: JetStream on file storage, monitoring, TLS when given, the users."""
    lines = [
        "# Generated by `tangram nats-config`: holds passwords, keep it secret (mode 0600).",
        f"port: {port}",
    ]
    if monitor_port is not None:
        lines.append(f"http_port: {monitor_port}")
    lines += ["jetstream {", f"  store_dir: {_quoted(store_dir)}", "}"]
    text = "\n".join(lines) + "\n"
    if tls is not None:
        text += _render_tls(tls)
    return text + render_users(users)


def build_callout_users(passwords: Mapping[str, str] | None = None) -> list[NatsUser]:
    """The static users beside the auth callout: admin, allocator and the callout itself.

    Node users are not listed: the callout issues each node's user when its services connect.
    The allocator is not given the node names (they are not known in advance), so its deny list
    names only its own durables' neighbours; it is the trusted decider either way.
    """
    given = dict(passwords or {})
    names = (ADMIN_USER, ALLOCATOR_USER, CALLOUT_USER)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise NatsAuthError(f"passwords given for unknown users: {', '.join(unknown)}")
    permissions = {
        ADMIN_USER: admin_permissions(),
        ALLOCATOR_USER: allocator_permissions(()),
        CALLOUT_USER: callout_permissions(),
    }
    return [
        NatsUser(name, check_password(name, given.get(name) or generate_password()), permissions[name])
        for name in names
    ]


def render_callout_authorization(
    users: Sequence[NatsUser], issuer: str, *, account: str = TANGRAM_ACCOUNT
) -> str:
    """The `accounts` and `authorization { auth_callout }` blocks: `users` authenticate with their
    passwords, every other connection is decided by the callout, whose user JWTs `issuer` (an
    account public key, `A...`) signs. Everyone is in `account`, which holds the streams."""
    if not re.fullmatch(r"A[A-Z2-7]{55}", issuer):
        raise NatsAuthError("the callout issuer must be an account public nkey (A..., 56 characters)")
    if not any(user.name == CALLOUT_USER for user in users):
        raise NatsAuthError(f"the callout's own user {CALLOUT_USER!r} must be among the static users")
    lines = ["accounts {", f"  {account}: {{", "    jetstream: enabled", "    users: ["]
    for user in users:
        lines += ["  " + line for line in _render_user(user)]
    lines += [
        "    ]",
        "  }",
        "}",
        "authorization {",
        "  auth_callout {",
        f"    issuer: {_quoted(issuer)}",
        f"    auth_users: {_subject_list([user.name for user in users])}",
        f"    account: {_quoted(account)}",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def render_callout_server_config(
    users: Sequence[NatsUser],
    issuer: str,
    *,
    store_dir: str = "/data/jetstream",
    port: int = 4222,
    monitor_port: int | None = 8222,
    tls: TlsFiles | None = None,
) -> str:
    """A whole nats-server config whose node users come from the auth callout."""
    lines = [
        "# Generated by `tangram nats-config --callout`: holds passwords, keep it secret (mode 0600).",
        f"port: {port}",
    ]
    if monitor_port is not None:
        lines.append(f"http_port: {monitor_port}")
    lines += ["jetstream {", f"  store_dir: {_quoted(store_dir)}", "}"]
    text = "\n".join(lines) + "\n"
    if tls is not None:
        text += _render_tls(tls)
    return text + render_callout_authorization(users, issuer)
