"""Follows every inventory publication with a ResourceSlice sync of the same hardware."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

from prometheus_client import Counter

from services.discovery.settings import DiscoverySettings
from tangram.dra import node_devices
from tangram.events import NodeHardware
from tangram.k8s import SliceRenderError, check_limits, render_slices
from tangram.kube import SlicePublisher, SyncReport, connect

log = logging.getLogger("tangram.discovery.slices")

SYNCS = Counter("tangram_discovery_slice_syncs_total", "ResourceSlice syncs by result", ["result"])


class SliceSync:
    """Renders the node's pool and hands it to the publisher; nothing here raises on API trouble."""

    def __init__(self, publisher: SlicePublisher, settings: DiscoverySettings) -> None:
        self._publisher = publisher
        self._settings = settings
        self._failing_since: float | None = None  # monotonic time of the first failure since the last success
        self._last_error = ""

    def readiness_problem(self) -> str | None:
        """Not ready once the slices have been out of sync for `slice_stale_s` (a readiness check)."""
        if self._failing_since is None:
            return None
        stale_s = time.monotonic() - self._failing_since
        if stale_s < self._settings.slice_stale_s:
            return None
        return f"ResourceSlices not synced for {stale_s:.0f} s: {self._last_error}"

    def _failed(self, error: str) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._last_error = error

    async def publish(self, hardware: NodeHardware, generation: int) -> SyncReport | None:
        """Sync the slices of `hardware`; None when they could not be rendered (logged, not sent)."""
        settings = self._settings
        try:
            slices = render_slices(
                node_devices(hardware, driver=settings.driver),
                k8s_version=settings.k8s_version,
                generation=generation,
                driver=settings.driver,
            )
        except SliceRenderError as error:
            self._failed(f"cannot render: {error}")
            SYNCS.labels("unrenderable").inc()
            log.error("ResourceSlices not published", extra={"error": str(error)})
            return None
        problems = check_limits(slices, settings.k8s_version)
        if problems:
            self._failed("over the API server's limits: " + "; ".join(problems))
            SYNCS.labels("unrenderable").inc()
            log.error("ResourceSlices not published", extra={"error": "; ".join(problems)})
            return None
        return self._count(await self._publisher.sync(slices))

    async def retry_if_due(self) -> SyncReport | None:
        report = await self._publisher.retry_if_due()
        return None if report is None else self._count(report)

    def _count(self, report: SyncReport) -> SyncReport:
        SYNCS.labels("ok" if report.ok else "failed").inc()
        if report.ok:
            self._failing_since = None
        else:
            self._failed(report.error or "sync failed")
        return report


@contextlib.asynccontextmanager
async def slice_sync(settings: DiscoverySettings) -> AsyncIterator[SliceSync]:
    api = await connect(kubeconfig=settings.kubeconfig)
    try:
        publisher = SlicePublisher(
            api, node=settings.node_name, driver=settings.driver, request_timeout_s=10.0
        )
        yield SliceSync(publisher, settings)
    finally:
        await api.close()
