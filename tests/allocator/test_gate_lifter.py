"""Gates are lifted apart from the watches: a watch handler only says which pods' gates may go, and
the patches go out several at a time; a patch the API server refuses is tried again later."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from services.allocator.clusterview import ClusterView
from services.allocator.gates import PodGates
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.kubernetes.objects.names import SCHEDULING_GATE

from .helpers import gpus


class Answer:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason, self._body = status, "", json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        return None


class HeldPatches:
    """patch_namespaced_pod as the API server answers it, each answer held until let go; the first
    `refuse` patches are refused (403)."""

    def __init__(self, refuse: int = 0) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()
        self.refuse = refuse
        self.changed = asyncio.Event()

    async def _patch(self, name: str, namespace: str, body: list[dict[str, Any]]) -> Answer:
        self.started.append(name)
        self.changed.set()
        await self.release.wait()
        if self.refuse > 0:
            self.refuse -= 1
            return Answer(403, {"kind": "Status", "reason": "Forbidden", "message": "no"})
        return Answer(200, pod(name, gate=False))

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        return self._patch(name, namespace, body)

    async def until_started(self, count: int) -> None:
        while len(self.started) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)


def claim(name: str, *, allocated: bool) -> dict[str, Any]:
    result = {"request": "gpus", "driver": "gpu.tangram.dev", "pool": "n1", "device": f"gpu-{name}"}
    status = {"allocation": {"devices": {"results": [result]}}} if allocated else {}
    return {
        "metadata": {"namespace": "a", "name": name, "uid": f"u-{name}"},
        "spec": gpus(1),
        "status": status,
    }


def pod(name: str, *, gate: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "a", "name": name, "uid": f"p-{name}", "resourceVersion": "7"},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}] if gate else [],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": f"c{name[1:]}"}],
        },
        "status": {},
    }


async def asked(claim: dict[str, Any]) -> None:
    return None


def view_with(count: int) -> ClusterView:
    view = ClusterView()
    view.classes = {m["metadata"]["name"]: m for m in load_shipped_device_classes()}
    view.listed.update({"classes", "claims", "pods"})
    for n in range(count):
        view.claims[("a", f"c{n}")] = claim(f"c{n}", allocated=False)
    return view


async def test_a_watch_handler_never_waits_for_a_patch_and_patches_go_out_together() -> None:
    patches = HeldPatches()
    view = view_with(4)
    gates = PodGates(patches, view, asked, request_timeout_s=5)  # type: ignore[arg-type]
    for n in range(4):
        await gates.pod_seen("ADDED", pod(f"p{n}"))
    assert patches.started == []  # unallocated: no gate is due
    stop = asyncio.Event()
    lifter = asyncio.create_task(gates.run(stop, max_lifts=3))
    try:
        for n in range(4):
            allocated = claim(f"c{n}", allocated=True)
            view.claims[("a", f"c{n}")] = allocated
            gates.lift_soon(allocated)  # returns at once, every patch still unanswered
        await patches.until_started(3)
        await asyncio.sleep(0.05)
        assert sorted(patches.started) == ["p0", "p1", "p2"]  # three at once, the fourth waits
        patches.release.set()
        await patches.until_started(4)
        while any(p["spec"]["schedulingGates"] for p in gates.pods.by_key.values()):
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        lifter.cancel()
        await asyncio.gather(lifter, return_exceptions=True)
    assert sorted(patches.started) == ["p0", "p1", "p2", "p3"]


async def test_a_refused_patch_is_tried_again_and_the_gate_goes() -> None:
    patches = HeldPatches(refuse=1)
    patches.release.set()
    view = view_with(1)
    gates = PodGates(patches, view, asked, request_timeout_s=5)  # type: ignore[arg-type]
    await gates.pod_seen("ADDED", pod("p0"))
    stop = asyncio.Event()
    lifter = asyncio.create_task(gates.run(stop))
    try:
        allocated = claim("c0", allocated=True)
        view.claims[("a", "c0")] = allocated
        gates.lift_soon(allocated)
        await patches.until_started(2)
        while gates.pods.by_key[("a", "p0")]["spec"]["schedulingGates"]:
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        lifter.cancel()
        await asyncio.gather(lifter, return_exceptions=True)
    assert patches.started == ["p0", "p0"]
