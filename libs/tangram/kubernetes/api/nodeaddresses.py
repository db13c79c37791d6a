"""Where peers reach a node: the address its Node reports, for daemons that talk node to node
(the IMEX daemons of an NVLink domain list their peers by address)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api.client import call

# The kubelet reports these; an internal address is the one peers in the cluster's network use.
ADDRESS_PREFERENCE = ("InternalIP", "ExternalIP", "Hostname")


def preferred_address(name: str, addresses: Sequence[Any]) -> str:
    """The address of the most preferred type among a Node's `status.addresses`; the node's name
    when it reports none (then it must resolve by name)."""
    by_type: dict[str, str] = {}
    for address in addresses:
        kind, value = getattr(address, "type", None), getattr(address, "address", None)
        if isinstance(kind, str) and isinstance(value, str) and value and kind not in by_type:
            by_type[kind] = value
    return next((by_type[kind] for kind in ADDRESS_PREFERENCE if kind in by_type), name)


class NodeAddresses:
    """Reads each named Node's preferred address from the API server; KubeApiError when a Node
    cannot be read."""

    def __init__(self, api: Any, *, request_timeout_s: float = 10.0) -> None:
        self._core = CoreV1Api(api)
        self._timeout = request_timeout_s

    async def __call__(self, names: Sequence[str]) -> list[str]:
        found = []
        for name in names:
            node = await call(f"read Node {name}", self._core.read_node(name, _request_timeout=self._timeout))
            status = node.status
            found.append(preferred_address(name, (status.addresses if status is not None else None) or []))
        return found
