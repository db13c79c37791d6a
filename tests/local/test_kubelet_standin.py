"""The kubelet stand-in keeps serving its node when one Pod's request hangs: the API client waits
for ever by default, and one request left hanging across an API server restart once held the
node's lock and every Pod of the node with it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tangram.kubelet.client import ClaimHandle, PreparedClaim
from tangram.local import kubelet
from tangram.local.kubelet import NodeKubelet


def pod(name: str, phase: str = "Pending") -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(namespace="team", name=name, uid=f"uid-{name}", deletion_timestamp=None),
        spec=SimpleNamespace(
            resource_claims=[SimpleNamespace(name="gpu", resource_claim_name=f"{name}-gpu")]
        ),
        status=SimpleNamespace(phase=phase, resource_claim_statuses=[], extended_resource_claim_status=None),
    )


class Api:
    """The API server as the stand-in sees it: claims allocated, and the mark of `hung` never answered
    until `answer` is set."""

    def __init__(self, hung: str) -> None:
        self.hung = hung
        self.answer = asyncio.Event()
        self.marked: list[str] = []
        self.pods: dict[str, Any] = {}

    async def read_namespaced_resource_claim(self, name: str, namespace: str, **_: Any) -> Any:
        return SimpleNamespace(
            metadata=SimpleNamespace(uid=f"claim-{name}"), status=SimpleNamespace(allocation={})
        )

    async def patch_namespaced_pod_status(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        if name == self.hung and not self.answer.is_set():
            await asyncio.Event().wait()  # a request nobody answers
        self.marked.append(name)
        return None

    async def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        return self.pods[name]


class Plugin:
    def __init__(self) -> None:
        self.prepared: list[str] = []

    async def prepare(self, claims: list[ClaimHandle]) -> dict[str, PreparedClaim]:
        self.prepared += [c.name for c in claims]
        return {c.uid: PreparedClaim(uid=c.uid, cdi_device_ids=[], devices=[], error="") for c in claims}

    async def close(self) -> None:
        return None


async def test_a_pod_whose_request_hangs_holds_neither_the_node_nor_itself_for_good(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kubelet, "RECONCILE_S", 0.3)
    monkeypatch.setattr(kubelet, "RETRY_S", (0.05,))
    api, plugin = Api(hung="stuck"), Plugin()
    async with ApiClient() as client:
        node = NodeKubelet(client, node="n1", dra_socket=tmp_path / "dra.sock")
    await node._client.close()
    node._core = node._resource = api
    node._client = plugin  # type: ignore[assignment]
    stuck, other = pod("stuck"), pod("other")
    api.pods = {"stuck": stuck, "other": other}

    try:
        await node._reconcile(stuck, deleted=False)  # its mark hangs: given up after the bound
        assert "uid-stuck" in node._retries  # and tried again later
        await asyncio.wait_for(node._reconcile(other, deleted=False), 5)
        assert api.marked == ["other"]  # the node went on

        # the stuck Pod is tried again: its claims were prepared, so it is only marked this time
        api.answer.set()
        async with asyncio.timeout(5):
            while "stuck" not in api.marked:
                await asyncio.sleep(0.02)
        assert plugin.prepared == ["stuck-gpu", "other-gpu"]
    finally:
        for retry in node._retries.values():
            retry.cancel()
        await asyncio.gather(*node._retries.values(), return_exceptions=True)
