"""Kubelet's side of the DRA plugin protocol: what `tangram demo` and benchmarks use to act as kubelet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from tangram.kubelet.proto import dra_v1_pb2, dra_v1_pb2_grpc

KUBELET_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class ClaimHandle:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    cdi_device_ids: list[str]
    devices: list[str]
    error: str


class KubeletClient:
    """Calls NodePrepareResources / NodeUnprepareResources (v1) on a plugin's DRA socket."""

    def __init__(self, dra_socket: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{dra_socket}")
        self._stub = dra_v1_pb2_grpc.DRAPluginStub(self._channel)

    async def prepare(self, claims: list[ClaimHandle]) -> dict[str, PreparedClaim]:
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        response = await self._stub.NodePrepareResources(request, timeout=KUBELET_TIMEOUT_S)
        return {
            uid: PreparedClaim(
                uid=uid,
                cdi_device_ids=[cdi for device in answer.devices for cdi in device.cdi_device_ids],
                devices=[device.device_name for device in answer.devices],
                error=answer.error,
            )
            for uid, answer in response.claims.items()
        }

    async def unprepare(self, claims: list[ClaimHandle]) -> dict[str, str]:
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        response = await self._stub.NodeUnprepareResources(request, timeout=KUBELET_TIMEOUT_S)
        return {uid: answer.error for uid, answer in response.claims.items()}

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> KubeletClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
