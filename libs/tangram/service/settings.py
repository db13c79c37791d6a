"""Configuration every service shares, from flags with environment defaults (TANGRAM_*)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tangram.events import subject_token


class ServiceSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_urls: tuple[str, ...] = Field(min_length=1)
    nats_credentials: Path | None = None
    # The pod's projected service-account token: the NATS auth callout turns it into this node's
    # user (node services only); re-read at every reconnection.
    nats_token_file: Path | None = None
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # Replicas of the streams a service creates when they are missing: 3 on a 3-server cluster.
    nats_stream_replicas: int = Field(default=1, ge=1, le=5)
    health_host: str = "127.0.0.1"
    health_port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port (logged)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("nats_urls")
    @classmethod
    def _urls_are_nats(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(f"{url!r} is not a NATS URL (nats://host:port)")
        return urls


class NodeSettings(ServiceSettings):
    """Settings of a per-node service."""

    node_name: str = Field(min_length=1, max_length=253)

    @field_validator("node_name")
    @classmethod
    def _node_is_dns(cls, name: str) -> str:
        subject_token(name)
        return name


_TRUE = {"1", "true", "yes", "on"}


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TANGRAM_{name}", default)


def env_flag(name: str) -> bool:
    """A TANGRAM_* switch: 1, true, yes or on (any case) turn it on."""
    return (os.environ.get(name) or "").strip().lower() in _TRUE


def add_service_arguments(parser: argparse.ArgumentParser, *, node: bool = False) -> None:
    parser.add_argument(
        "--nats-url",
        action="append",
        dest="nats_urls",
        help="NATS server URL; repeatable (env TANGRAM_NATS_URL, comma-separated)",
    )
    parser.add_argument("--nats-credentials", default=_env("NATS_CREDENTIALS"), help="NATS .creds file")
    parser.add_argument(
        "--nats-token-file",
        default=_env("NATS_TOKEN_FILE"),
        help="projected service-account token sent to the NATS auth callout (env TANGRAM_NATS_TOKEN_FILE)",
    )
    parser.add_argument("--nats-tls-ca", default=_env("NATS_TLS_CA"))
    parser.add_argument("--nats-tls-cert", default=_env("NATS_TLS_CERT"))
    parser.add_argument("--nats-tls-key", default=_env("NATS_TLS_KEY"))
    parser.add_argument(
        "--nats-stream-replicas",
        default=_env("NATS_STREAM_REPLICAS", "1"),
        help="replicas of each JetStream stream: 1 on one server, 3 on a 3-server cluster",
    )
    parser.add_argument("--health-host", default=_env("HEALTH_HOST", "127.0.0.1"))
    parser.add_argument(
        "--health-port", type=int, default=int(_env("HEALTH_PORT", "0") or 0), help="health and metrics port"
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    if node:
        parser.add_argument(
            "--node-name",
            default=_env("NODE_NAME"),
            help="this node's Kubernetes name (env TANGRAM_NODE_NAME)",
        )


def service_fields(args: argparse.Namespace) -> dict[str, object]:
    urls = args.nats_urls or [u for u in (_env("NATS_URL", "nats://127.0.0.1:4222") or "").split(",") if u]
    fields: dict[str, object] = {
        "nats_urls": tuple(urls),
        "nats_credentials": args.nats_credentials,
        "nats_token_file": args.nats_token_file,
        "nats_tls_ca": args.nats_tls_ca,
        "nats_tls_cert": args.nats_tls_cert,
        "nats_tls_key": args.nats_tls_key,
        "nats_stream_replicas": args.nats_stream_replicas,
        "health_host": args.health_host,
        "health_port": args.health_port,
        "log_level": args.log_level,
    }
    if hasattr(args, "node_name"):
        fields["node_name"] = args.node_name
    return fields


Settings = TypeVar("Settings", bound=BaseModel)


def validated(parser: argparse.ArgumentParser, build: Callable[[], Settings]) -> Settings:
    """The settings `build` makes, or exit as argparse does, naming each value refused and why."""
    try:
        return build()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        parser.error(problems)
