"""Follows every inventory publication with a ResourceSlice sync of the same hardware.

The layout comes from the API server (see `tangram.kubernetes.api.layout`) unless `--k8s-version` overrides
it; where partitionable devices are off, only whole GPUs and existing MIG instances are published.
A watch on the node's own slices repairs any change someone else makes to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import Counter

from services.discovery.settings import DiscoverySettings
from services.discovery.topology import NodeTopology
from tangram.events import NodeHardware
from tangram.kubernetes.api import KubeApiError, SlicePublisher, SyncReport, connect
from tangram.kubernetes.api.layout import (
    LayoutError,
    SliceLayout,
    announce,
    detect_layout,
    layout_slices,
    overridden,
)
from tangram.kubernetes.objects import SliceRenderError, check_limits

log = logging.getLogger("tangram.discovery.slices")

SYNCS = Counter("tangram_discovery_slice_syncs_total", "ResourceSlice syncs by result", ["result"])


class SliceSync:
    """Renders the node's pool and hands it to the publisher; nothing here raises on API trouble."""

    def __init__(self, publisher: SlicePublisher, settings: DiscoverySettings, api: Any) -> None:
        self._publisher = publisher
        self._settings = settings
        self._api = api
        self.topology = NodeTopology(api, node=settings.node_name, label=settings.network_block_label)
        self._layout = overridden(settings.k8s_version) if settings.k8s_version is not None else None
        if self._layout is not None:
            announce(self._layout, settings.node_name)
        self._latest: tuple[NodeHardware, int] | None = None
        self._unpublished = False
        self._failing_since: float | None = None  # monotonic time of the first failure since the last success
        self._last_error = ""
        self._sync_failing = False

    @property
    def publisher(self) -> SlicePublisher:
        return self._publisher

    async def layout(self) -> SliceLayout | None:
        """The layout in use, detected on first need; None (logged) while the server cannot be asked."""
        if self._layout is None:
            settings = self._settings
            try:
                self._layout = await detect_layout(self._api, node=settings.node_name, driver=settings.driver)
            except (KubeApiError, LayoutError) as error:
                self._failed(f"layout unknown: {error}")
                log.error("ResourceSlice layout unknown, slices not published", extra={"error": str(error)})
                return None
            announce(self._layout, settings.node_name)
        return self._layout

    def readiness_problem(self) -> str | None:
        """Not ready once the slices have been out of sync for `slice_stale_s` (a readiness check)."""
        if self._failing_since is None:
            return None
        synced_at = self._publisher.synced_at
        if self._sync_failing and synced_at is not None and synced_at >= self._failing_since:
            # the drift watch's own sync of the same slices succeeded since
            self._failing_since = None
            return None
        stale_s = time.monotonic() - self._failing_since
        if stale_s < self._settings.slice_stale_s:
            return None
        return f"ResourceSlices not synced for {stale_s:.0f} s: {self._last_error}"

    def _failed(self, error: str, *, sync: bool = False) -> None:
        """`sync`: the slices rendered but the API server did not take them (any later sync may)."""
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._last_error = error
        self._sync_failing = sync

    async def publish(self, hardware: NodeHardware, generation: int) -> SyncReport | None:
        """Sync the slices of `hardware`; None when they could not be rendered (logged, not sent)."""
        self._latest = (hardware, generation)
        self._unpublished = True
        layout = await self.layout()
        if layout is None:
            SYNCS.labels("failed").inc()
            return None
        self._unpublished = False
        settings = self._settings
        try:
            slices = layout_slices(layout, hardware, generation=generation, driver=settings.driver)
        except SliceRenderError as error:
            self._failed(f"cannot render: {error}")
            SYNCS.labels("unrenderable").inc()
            log.error("ResourceSlices not published", extra={"error": str(error)})
            return None
        problems = check_limits(slices, layout.k8s_version)
        if problems:
            self._failed("over the API server's limits: " + "; ".join(problems))
            SYNCS.labels("unrenderable").inc()
            log.error("ResourceSlices not published", extra={"error": "; ".join(problems)})
            return None
        return self._count(await self._publisher.sync(slices))

    async def retry_if_due(self) -> SyncReport | None:
        if self._unpublished and self._latest is not None:
            return await self.publish(*self._latest)
        report = await self._publisher.retry_if_due()
        return None if report is None else self._count(report)

    def _count(self, report: SyncReport) -> SyncReport:
        SYNCS.labels("ok" if report.ok else "failed").inc()
        if report.ok:
            self._failing_since = None
        else:
            self._failed(report.error or "sync failed", sync=True)
        return report


@contextlib.asynccontextmanager
async def slice_sync(settings: DiscoverySettings) -> AsyncIterator[SliceSync]:
    """The sync, with the publisher's drift-repairing watch running for as long as it is open."""
    api = await connect(kubeconfig=settings.kubeconfig)
    watch: asyncio.Task[None] | None = None
    try:
        publisher = SlicePublisher(
            api, node=settings.node_name, driver=settings.driver, request_timeout_s=10.0
        )
        watch = asyncio.create_task(publisher.watch(), name=f"slice-watch-{settings.node_name}")
        yield SliceSync(publisher, settings, api)
    finally:
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        await api.close()
