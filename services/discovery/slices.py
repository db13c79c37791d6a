"""Follows every inventory publication with a ResourceSlice sync of the same hardware.

The layout comes from the API server (see `tangram.kube.layout`) unless `--k8s-version` overrides
it; where partitionable devices are off, only whole GPUs and existing MIG instances are published.
A watch on the node's own slices repairs any change someone else makes to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import Counter

from services.discovery.settings import DiscoverySettings
from tangram.dra import node_devices, untainted_only, whole_devices_only
from tangram.events import NodeHardware
from tangram.k8s import SliceRenderError, check_limits, render_slices
from tangram.kube import KubeApiError, SlicePublisher, SyncReport, connect
from tangram.kube.layout import LayoutError, SliceLayout, announce, detect_layout, overridden

log = logging.getLogger("tangram.discovery.slices")

SYNCS = Counter("tangram_discovery_slice_syncs_total", "ResourceSlice syncs by result", ["result"])


class SliceSync:
    """Renders the node's pool and hands it to the publisher; nothing here raises on API trouble."""

    def __init__(self, publisher: SlicePublisher, settings: DiscoverySettings, api: Any) -> None:
        self._publisher = publisher
        self._settings = settings
        self._api = api
        self._layout = overridden(settings.k8s_version) if settings.k8s_version is not None else None
        if self._layout is not None:
            announce(self._layout, settings.node_name)
        self._latest: tuple[NodeHardware, int] | None = None
        self._unpublished = False

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
                log.error("ResourceSlice layout unknown, slices not published", extra={"error": str(error)})
                return None
            announce(self._layout, settings.node_name)
        return self._layout

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
        devices = node_devices(hardware, driver=settings.driver)
        if not layout.partitionable:
            devices = whole_devices_only(devices)
        if not layout.taints:
            devices = untainted_only(devices)
        try:
            slices = render_slices(
                devices, k8s_version=layout.k8s_version, generation=generation, driver=settings.driver
            )
        except SliceRenderError as error:
            SYNCS.labels("unrenderable").inc()
            log.error("ResourceSlices not published", extra={"error": str(error)})
            return None
        problems = check_limits(slices, layout.k8s_version)
        if problems:
            SYNCS.labels("unrenderable").inc()
            log.error("ResourceSlices not published", extra={"error": "; ".join(problems)})
            return None
        return self._count(await self._publisher.sync(slices))

    async def retry_if_due(self) -> SyncReport | None:
        if self._unpublished and self._latest is not None:
            return await self.publish(*self._latest)
        report = await self._publisher.retry_if_due()
        return None if report is None else self._count(report)

    @staticmethod
    def _count(report: SyncReport) -> SyncReport:
        SYNCS.labels("ok" if report.ok else "failed").inc()
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
