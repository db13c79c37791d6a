"""Tangram's scheduling gate on a pod: whether it holds it, and the JSONPatches that add or lift it.

One place for admission (which adds the gate) and the allocator (which lifts it once it has
written the allocation, or at once for a pod none of whose claims is Tangram's). Pods are plain
dicts as the API server sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tangram.kubernetes.objects.names import SCHEDULING_GATE


def _gates(pod: Mapping[str, Any]) -> list[Any]:
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    return gates if isinstance(gates, list) else []


def holds_gate(pod: Mapping[str, Any], gate: str = SCHEDULING_GATE) -> bool:
    return any(isinstance(g, Mapping) and g.get("name") == gate for g in _gates(pod))


def add_gate_patch(pod: Mapping[str, Any], gate: str = SCHEDULING_GATE) -> list[dict[str, Any]] | None:
    """The JSONPatch that adds `gate`; None when the pod holds it already, or names its node
    itself (the API server refuses scheduling gates on such a pod). Only at creation: the API
    server refuses new gates on an existing pod."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping) or spec.get("nodeName") or holds_gate(pod, gate):
        return None
    if _gates(pod):
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]}]


def remove_gate_patch(pod: Mapping[str, Any], gate: str = SCHEDULING_GATE) -> list[dict[str, Any]] | None:
    """The JSONPatch that lifts `gate` and keeps every other gate; None when the pod does not hold
    it. The patch tests the gate's position first, so a pod whose gates changed since it was read
    is refused (422) instead of losing another gate: read it again and retry."""
    for index, entry in enumerate(_gates(pod)):
        if isinstance(entry, Mapping) and entry.get("name") == gate:
            path = f"/spec/schedulingGates/{index}"
            return [{"op": "test", "path": f"{path}/name", "value": gate}, {"op": "remove", "path": path}]
    return None
