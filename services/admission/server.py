"""The HTTPS endpoint the API server calls: POST /mutate with an AdmissionReview.

Every answer the API server can read is "allowed", with the gate's JSONPatch or without: the
webhook only ever delays scheduling, never refuses a pod. Bodies over `max_body_bytes` get 413,
non-JSON content 415, a body not in within the body timeout 408 (and the connection is closed),
and a body that is no AdmissionReview 400, each counted; a review for
another resource or operation gets an allowed answer without a patch. A pod whose claims cannot be
looked up in time is gated all the same: let through, kube-scheduler would allocate Tangram's
devices beside Tangram's allocator; gated, it waits a moment longer, and the allocator lifts the
gate of a pod none of whose claims is Tangram's.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from services.admission.certs import TlsMaterial, not_after
from services.admission.connections import CLOSED_BY_BOUND, BoundedSite, ConnectionBounds
from services.admission.lookup import ClaimLookup
from services.admission.review import BadReview, answer, claim_references, gate_patch, parse
from tangram.kubernetes.api import KubeApiError

log = logging.getLogger("tangram.admission")

REVIEWS = Counter(
    "tangram_admission_reviews_total",
    "AdmissionReviews answered, by outcome: gated, passed (no Tangram claim, or gated already), "
    "ignored (not a pod CREATE), lookup_failed (claims unreadable in time), refused (bad or late body)",
    ["outcome"],
)
REVIEW_SECONDS = Histogram(
    "tangram_admission_review_seconds",
    "Time to answer one AdmissionReview",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

CERTIFICATE_EXPIRY = Gauge(
    "tangram_admission_certificate_expiry_timestamp_seconds",
    "When the serving certificate this replica serves expires (renewed with a third of its life left)",
)

MAX_BODY_BYTES = 4 * 1024 * 1024


def server_tls(
    directory: Path, material: TlsMaterial, context: ssl.SSLContext | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving `material` (key files written to `directory`, mode 0600);
    given `context`, the material is loaded into it: connections from then on get the new
    certificate, open ones keep theirs."""
    if context is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert, key = directory / "tls.crt", directory / "tls.key"
    for path, data in ((cert, material.cert), (key, material.key)):
        partial = path.with_suffix(".new")
        partial.touch(mode=0o600)
        partial.write_bytes(data)
        partial.replace(path)
    context.load_cert_chain(cert, key)
    CERTIFICATE_EXPIRY.set(not_after(material).timestamp())
    return context


class AdmissionServer:
    def __init__(
        self,
        lookup: ClaimLookup,
        *,
        lookup_timeout_s: float = 3.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        bounds: ConnectionBounds | None = None,
    ) -> None:
        self._lookup = lookup
        self._timeout = lookup_timeout_s
        self._max_body = max_body_bytes
        self._bounds = bounds or ConnectionBounds()
        self._runner: web.AppRunner | None = None
        self._site: BoundedSite | None = None
        self.port = 0

    @property
    def open_connections(self) -> int:
        """Connections open to this server now, those in their TLS handshake included."""
        return self._site.open_connections if self._site is not None else 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body)
        app.router.add_post("/mutate", self._mutate)
        return app

    async def start(self, host: str, port: int, tls: ssl.SSLContext) -> None:
        self._runner = web.AppRunner(
            self.app(),
            access_log=None,
            shutdown_timeout=5.0,
            # aiohttp's RequestHandler: its keep-alive timer closes a connection with no complete
            # request head this long after its handshake or its last answer (3,630 s by default)
            keepalive_timeout=self._bounds.idle_timeout_s,
            # how long a body left unread (too large, or late) may still arrive before the
            # connection is closed (10 s by default): the same bound as for reading one
            lingering_time=self._bounds.body_timeout_s,
        )
        await self._runner.setup()
        self._site = BoundedSite(self._runner, host, port, tls, self._bounds)
        await self._site.start()
        self.port = self._site.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _mutate(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            outcome, response = await self._answer(request)
        finally:
            REVIEW_SECONDS.observe(time.perf_counter() - started)
        REVIEWS.labels(outcome).inc()
        return response

    async def _answer(self, request: web.Request) -> tuple[str, web.Response]:
        if request.content_type != "application/json":
            return "refused", web.json_response({"error": "expected application/json"}, status=415)
        if request.content_length is not None and request.content_length > self._max_body:
            return "refused", _too_large(self._max_body)
        try:
            async with asyncio.timeout(self._bounds.body_timeout_s):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return "refused", _too_large(self._max_body)
        except TimeoutError:
            # a client that trickles or stalls its body would hold this handler and its connection
            CLOSED_BY_BOUND.labels("body").inc()
            late = web.json_response(
                {"error": f"the body did not arrive within {self._bounds.body_timeout_s} s"}, status=408
            )
            late.force_close()
            return "refused", late
        try:
            review = parse(body)
        except BadReview as error:
            if error.uid is None:
                log.warning("refused a body that is no AdmissionReview", extra={"why": str(error)})
                return "refused", web.json_response({"error": str(error)}, status=400)
            log.info("let a review through unchanged", extra={"uid": error.uid, "why": str(error)})
            return "ignored", web.json_response(answer(error.uid))
        references = claim_references(review.pod)
        patch = gate_patch(review.pod) if references else None
        if patch is None:
            return "passed", web.json_response(answer(review.uid))
        try:
            verdict = await asyncio.wait_for(
                self._lookup.verdict(review.namespace, references), self._timeout
            )
        except (KubeApiError, TimeoutError) as error:
            log.warning(
                "claims could not be looked up: the pod is gated, and the allocator lifts the gate "
                "if none of its claims is Tangram's",
                extra={"uid": review.uid, "namespace": review.namespace, "why": str(error) or "timeout"},
            )
            return "lookup_failed", web.json_response(answer(review.uid, patch))
        extra = {"uid": review.uid, "namespace": review.namespace, "why": verdict.reason}
        if not verdict.gate:
            log.debug("pod not gated", extra=extra)
            return "passed", web.json_response(answer(review.uid))
        log.info("pod gated until Tangram allocates its claims", extra=extra)
        return "gated", web.json_response(answer(review.uid, patch))


def _too_large(limit: int) -> web.Response:
    return web.json_response({"error": f"the body exceeds {limit} bytes"}, status=413)
