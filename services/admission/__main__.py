"""python -m services.admission: the mutating webhook that holds pods using Tangram's claims.

Connects to Kubernetes as its own service account, makes or reuses its certificates (a Secret),
patches the caBundle of its MutatingWebhookConfiguration, serves HTTPS on --port and health and
metrics on --health-port, checks the certificates every --check-interval seconds, and stops
gracefully on SIGTERM (open reviews are answered first). It also removes Tangram's scheduling gate
from any pod that has held it longer than --gate-timeout seconds while the allocator is down (its
Lease tangram-allocator in --allocator-namespace missing or not renewed within the timeout;
`services.admission.gatekeeper`): kube-scheduler then decides the pod's claims and Tangram adopts them.
Its HTTPS connections are bounded (`services.admission.connections`): --handshake-timeout,
--idle-timeout, --body-timeout and --max-connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.admission.certs import CA_DAYS, SERVING_DAYS, TlsMaterial
from services.admission.connections import ConnectionBounds
from services.admission.gatekeeper import GateKeeper
from services.admission.keeper import CertificateKeeper
from services.admission.lookup import ClaimLookup
from services.admission.server import MAX_BODY_BYTES, AdmissionServer, server_tls
from tangram.kubernetes.api import KubeApiError, KubeConfigError, connect
from tangram.service.health import HealthServer
from tangram.service.logs import configure_logging

log = logging.getLogger("tangram.admission")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

BOUNDS = ConnectionBounds()  # the defaults, justified in ConnectionBounds


class AdmissionSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(default=8443, ge=0, le=65535)  # 0: pick a free port (logged)
    namespace: str = Field(min_length=1, max_length=63)
    service: str = Field(default="tangram-admission", min_length=1, max_length=63)
    secret: str = Field(default="tangram-admission-tls", min_length=1, max_length=253)
    # None: serve the Secret's certificates without touching any webhook configuration
    webhook_configuration: str | None = "tangram-admission"
    # the names the serving certificate holds; empty: the Service's DNS names
    cert_hosts: tuple[str, ...] = ()
    kubeconfig: Path | None = None
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=1024, le=64 * 1024 * 1024)
    # a client's TLS handshake, its next request head, and a request's body; at most 60 s, 1 h and
    # 5 min: far past any API server's patience, so a larger value only holds a stalled connection
    handshake_timeout_s: float = Field(default=BOUNDS.handshake_timeout_s, gt=0, le=60)
    idle_timeout_s: float = Field(default=BOUNDS.idle_timeout_s, gt=0, le=3600)
    body_timeout_s: float = Field(default=BOUNDS.body_timeout_s, gt=0, le=300)
    # open HTTPS connections; each is a file descriptor and up to ~300 KB
    max_connections: int = Field(default=BOUNDS.max_connections, ge=1, le=100_000)
    lookup_timeout_s: float = Field(default=3.0, gt=0, le=30)
    check_interval_s: float = Field(default=3600.0, gt=0)
    # seconds a pod may hold Tangram's gate before it is removed and kube-scheduler decides; 0: never
    gate_timeout_s: float = Field(default=120.0, ge=0)
    # where the allocator keeps its Lease (tangram-allocator); None: this webhook's namespace
    allocator_namespace: str | None = Field(default=None, min_length=1, max_length=63)
    ca_days: int = Field(default=CA_DAYS, ge=2)
    serving_days: int = Field(default=SERVING_DAYS, ge=1)
    work_dir: Path | None = None
    health_host: str = "127.0.0.1"
    health_port: int = Field(default=0, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("cert_hosts")
    @classmethod
    def _hosts_are_names(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            if not host or len(host) > 253 or any(c.isspace() or c in "/,*" for c in host):
                raise ValueError(f"{host!r} is not a host name or IP address")
        return hosts

    def bounds(self) -> ConnectionBounds:
        return ConnectionBounds(
            handshake_timeout_s=self.handshake_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            body_timeout_s=self.body_timeout_s,
            max_connections=self.max_connections,
        )

    def hosts(self) -> tuple[str, ...]:
        if self.cert_hosts:
            return self.cert_hosts
        svc, ns = self.service, self.namespace
        return (f"{svc}.{ns}.svc", svc, f"{svc}.{ns}", f"{svc}.{ns}.svc.cluster.local")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TANGRAM_{name}", default)


def _default_namespace() -> str | None:
    explicit = _env("ADMISSION_NAMESPACE")
    if explicit:
        return explicit
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    return None


def parse_args(argv: list[str] | None = None) -> AdmissionSettings:
    parser = argparse.ArgumentParser(prog="python -m services.admission", description=__doc__)
    parser.add_argument("--host", default=_env("ADMISSION_HOST", "0.0.0.0"), help="HTTPS listen address")
    parser.add_argument("--port", type=int, default=int(_env("ADMISSION_PORT", "8443") or 8443))
    parser.add_argument(
        "--namespace",
        default=_default_namespace(),
        help="namespace of the Service and the Secret (env TANGRAM_ADMISSION_NAMESPACE; "
        "default: the pod's own)",
    )
    parser.add_argument("--service", default=_env("ADMISSION_SERVICE", "tangram-admission"))
    parser.add_argument("--secret", default=_env("ADMISSION_SECRET", "tangram-admission-tls"))
    parser.add_argument(
        "--webhook-configuration",
        default=_env("ADMISSION_WEBHOOK_CONFIGURATION", "tangram-admission"),
        help="the MutatingWebhookConfiguration whose caBundle this keeps ('' for none)",
    )
    parser.add_argument(
        "--cert-host",
        action="append",
        dest="cert_hosts",
        help="DNS name or IP the serving certificate holds; repeatable (env TANGRAM_ADMISSION_CERT_HOSTS, "
        "comma-separated; default: the Service's DNS names)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, default=None, help="default: in-cluster, else ~/.kube/config"
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=int(_env("ADMISSION_MAX_BODY_BYTES", str(MAX_BODY_BYTES)) or 0)
    )
    parser.add_argument(
        "--handshake-timeout",
        type=float,
        default=float(_env("ADMISSION_HANDSHAKE_TIMEOUT_S") or BOUNDS.handshake_timeout_s),
        help="seconds from a connection's accept to the end of its TLS handshake, else it is closed "
        f"(env TANGRAM_ADMISSION_HANDSHAKE_TIMEOUT_S; default {BOUNDS.handshake_timeout_s:g})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=float(_env("ADMISSION_IDLE_TIMEOUT_S") or BOUNDS.idle_timeout_s),
        help="seconds a connection may wait, after its handshake or its last answer, before a "
        "complete request head arrives, else it is closed (idle keep-alive connections, stalled "
        f"heads; env TANGRAM_ADMISSION_IDLE_TIMEOUT_S; default {BOUNDS.idle_timeout_s:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=float(_env("ADMISSION_BODY_TIMEOUT_S") or BOUNDS.body_timeout_s),
        help="seconds to read a request's body, else it gets 408 and its connection is closed "
        f"(env TANGRAM_ADMISSION_BODY_TIMEOUT_S; default {BOUNDS.body_timeout_s:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=int(_env("ADMISSION_MAX_CONNECTIONS") or BOUNDS.max_connections),
        help="HTTPS connections open at once; one accepted beyond is closed at once "
        f"(env TANGRAM_ADMISSION_MAX_CONNECTIONS; default {BOUNDS.max_connections})",
    )
    parser.add_argument(
        "--lookup-timeout", type=float, default=float(_env("ADMISSION_LOOKUP_TIMEOUT_S", "3") or 3)
    )
    parser.add_argument(
        "--check-interval",
        type=float,
        default=float(_env("ADMISSION_CHECK_INTERVAL_S", "3600") or 3600),
        help="seconds between certificate checks (renewal, caBundle)",
    )
    parser.add_argument(
        "--gate-timeout",
        type=float,
        default=float(_env("ADMISSION_GATE_TIMEOUT_S", "120") or 0),
        help="seconds a pod may hold Tangram's scheduling gate (from its creation) before it is "
        "removed and kube-scheduler allocates its claims; 0 never removes it "
        "(env TANGRAM_ADMISSION_GATE_TIMEOUT_S)",
    )
    parser.add_argument(
        "--allocator-namespace",
        default=_env("ADMISSION_ALLOCATOR_NAMESPACE") or None,
        help="namespace of the allocator's Lease tangram-allocator, read before lifting any gate "
        "(env TANGRAM_ADMISSION_ALLOCATOR_NAMESPACE; default: --namespace)",
    )
    parser.add_argument("--ca-days", type=int, default=int(_env("ADMISSION_CA_DAYS", str(CA_DAYS)) or 0))
    parser.add_argument(
        "--serving-days", type=int, default=int(_env("ADMISSION_SERVING_DAYS", str(SERVING_DAYS)) or 0)
    )
    parser.add_argument("--work-dir", type=Path, default=_env("ADMISSION_WORK_DIR"))
    parser.add_argument("--health-host", default=_env("HEALTH_HOST", "127.0.0.1"))
    parser.add_argument(
        "--health-port",
        type=int,
        default=int(_env("HEALTH_PORT", "0") or 0),
        help="/healthz /readyz /metrics",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    hosts = args.cert_hosts or [h for h in (_env("ADMISSION_CERT_HOSTS") or "").split(",") if h]
    if not args.namespace:
        parser.error("--namespace is required outside a pod (env TANGRAM_ADMISSION_NAMESPACE)")
    try:
        return AdmissionSettings(
            host=args.host,
            port=args.port,
            namespace=args.namespace,
            service=args.service,
            secret=args.secret,
            webhook_configuration=args.webhook_configuration or None,
            cert_hosts=tuple(hosts),
            kubeconfig=args.kubeconfig,
            max_body_bytes=args.max_body_bytes,
            handshake_timeout_s=args.handshake_timeout,
            idle_timeout_s=args.idle_timeout,
            body_timeout_s=args.body_timeout,
            max_connections=args.max_connections,
            lookup_timeout_s=args.lookup_timeout,
            check_interval_s=args.check_interval,
            gate_timeout_s=args.gate_timeout,
            allocator_namespace=args.allocator_namespace,
            ca_days=args.ca_days,
            serving_days=args.serving_days,
            work_dir=args.work_dir,
            health_host=args.health_host,
            health_port=args.health_port,
            log_level=args.log_level,
        )
    except ValidationError as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits


async def run(settings: AdmissionSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        api = await connect(kubeconfig=settings.kubeconfig)
    except KubeConfigError as exc:
        raise SystemExit(f"tangram admission: {exc}") from None
    bundle_reason: list[str] = ["the caBundle is not patched yet"]
    serving = asyncio.Event()
    health = HealthServer(
        settings.health_host,
        settings.health_port,
        serving.is_set,
        [lambda: bundle_reason[0] if bundle_reason else None],
    )
    keeper = CertificateKeeper(
        api,
        namespace=settings.namespace,
        secret=settings.secret,
        webhook_configuration=settings.webhook_configuration,
        hosts=settings.hosts(),
        ca_days=settings.ca_days,
        serving_days=settings.serving_days,
    )
    server = AdmissionServer(
        ClaimLookup(api, request_timeout_s=settings.lookup_timeout_s),
        lookup_timeout_s=settings.lookup_timeout_s,
        max_body_bytes=settings.max_body_bytes,
        bounds=settings.bounds(),
    )
    gates = (
        GateKeeper(
            api,
            timeout_s=settings.gate_timeout_s,
            lease_namespace=settings.allocator_namespace or settings.namespace,
        )
        if settings.gate_timeout_s > 0
        else None
    )
    keeping = asyncio.create_task(gates.run(stop)) if gates is not None else None
    if keeping is not None:
        # the gate keeper failing stops the webhook (its error raised below), never silently
        keeping.add_done_callback(lambda _: stop.set())
    with tempfile.TemporaryDirectory(prefix="tangram-admission-", dir=settings.work_dir) as work:
        try:
            await health.start()
            material = await _keep(keeper, None, bundle_reason, stop)
            if material is None:
                return 0
            tls = server_tls(Path(work), material)
            await server.start(settings.host, settings.port, tls)
            serving.set()
            print(
                f"tangram admission: serving https on port {server.port}, health on port {health.port}",
                file=sys.stderr,
                flush=True,
            )
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), settings.check_interval_s)
                if stop.is_set():
                    break
                fresh = await _keep(keeper, material, bundle_reason, stop, once=True)
                if fresh is not None and fresh != material:
                    server_tls(Path(work), fresh, tls)
                    material = fresh
                    log.info("serving the renewed certificate")
        finally:
            serving.clear()
            if keeping is not None:
                keeping.cancel()
                await asyncio.wait([keeping])
            await server.stop()
            await health.stop()
            await api.close()
    if keeping is not None and not keeping.cancelled() and keeping.exception() is not None:
        raise SystemExit(f"tangram admission: the gate keeper failed: {keeping.exception()!r}")
    return 0


async def _keep(
    keeper: CertificateKeeper,
    current: TlsMaterial | None,
    bundle_reason: list[str],
    stop: asyncio.Event,
    *,
    once: bool = False,
) -> TlsMaterial | None:
    """The material to serve, the caBundle patched; retried every few seconds until it works
    (or once, keeping `current` on failure). None when stopped first."""
    delay = 1.0
    while not stop.is_set():
        try:
            material = await keeper.ensure_material()
        except KubeApiError as error:
            log.warning("cannot read or write the webhook's certificates", extra={"why": str(error)})
            if once:
                return current
        else:
            try:
                await keeper.ensure_ca_bundle(material)
            except KubeApiError as error:
                bundle_reason[:] = [f"cannot patch the caBundle: {error}"]
                log.warning("cannot patch the webhook's caBundle", extra={"why": str(error)})
            else:
                bundle_reason.clear()
            # serve even while the caBundle cannot be patched: a bundle patched before still matches
            return material
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 30.0)
    return None


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    configure_logging("admission", settings.log_level)
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
