"""gRPC servicers: translate kubelet's protobuf messages to and from the ClaimPreparer."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prometheus_client import Histogram

from tangram.cdi.devices import ClaimRef
from tangram.kubelet.health import HealthBoard
from tangram.kubelet.preparer import ClaimPreparer
from tangram.kubelet.proto import dra_health_v1alpha1_pb2, dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_pb2

log = logging.getLogger(__name__)

PREPARE_SECONDS = Histogram(
    "tangram_cdi_prepare_seconds",
    "Time to answer one NodePrepareResources call from kubelet, all its claims together",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

DRA_PLUGIN_TYPE = "DRAPlugin"
# Kubelet picks the newest service it knows from this list and calls it on the endpoint.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class DraServicer:
    """Serves one version of k8s.io.kubelet.pkg.apis.dra.<version>.DRAPlugin; v1 and v1beta1 share it."""

    def __init__(self, preparer: ClaimPreparer, messages: ModuleType) -> None:
        self._preparer = preparer
        self._messages = messages
        self._shares = "share_id" in messages.Device.DESCRIPTOR.fields_by_name

    @staticmethod
    def _claims(request: Any) -> list[ClaimRef]:
        return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        outcomes = await self._preparer.prepare(self._claims(request))
        PREPARE_SECONDS.observe(time.perf_counter() - started)
        response = self._messages.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            answer = response.claims[uid]
            if outcome.error:
                answer.error = outcome.error
                continue
            for device in outcome.devices:
                added = answer.devices.add(
                    request_names=[device.request],
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if device.share_id and self._shares:
                    # v1 only: kubelet tells the shares of one device apart by it
                    added.share_id = device.share_id
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        errors = await self._preparer.unprepare(self._claims(request))
        response = self._messages.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


def dra_servicers(preparer: ClaimPreparer) -> dict[str, DraServicer]:
    return {
        "v1": DraServicer(preparer, dra_v1_pb2),
        "v1beta1": DraServicer(preparer, dra_v1beta1_pb2),
    }


_HEALTH_STATUS = {
    "healthy": dra_health_v1alpha1_pb2.HEALTHY,
    "unhealthy": dra_health_v1alpha1_pb2.UNHEALTHY,
    "unknown": dra_health_v1alpha1_pb2.UNKNOWN,
}


class DraHealthServicer:
    """kubelet's DRA health service: every device's health, then again at every change."""

    def __init__(self, board: HealthBoard) -> None:
        self._board = board

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        messages = dra_health_v1alpha1_pb2
        async for devices in self._board.watch():
            yield messages.NodeWatchResourcesResponse(
                devices=[
                    messages.DeviceHealth(
                        device=messages.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                        health=_HEALTH_STATUS[d.status],
                        last_updated_time=d.since,
                    )
                    for d in devices
                ]
            )


@dataclass
class RegistrationState:
    """What kubelet last said about the registration (NotifyRegistrationStatus)."""

    notifications: int = 0
    registered: bool = False
    error: str = ""


class RegistrationServicer:
    def __init__(self, *, driver_name: str, endpoint: str, state: RegistrationState) -> None:
        self._driver_name = driver_name
        self._endpoint = endpoint
        self.state = state

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self._driver_name,
            endpoint=self._endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.state.notifications += 1
        self.state.registered = bool(request.plugin_registered)
        self.state.error = request.error
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", self._driver_name)
        else:
            log.error("kubelet refused DRA driver %s: %s", self._driver_name, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()
