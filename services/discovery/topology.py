"""The node's place in the datacenter network, read from its Node's labels.

Cluster operators (or their cloud) label each Node with the network block it sits under; the
allocator keeps a group of pods spread over several nodes under one block. The label is read when
the service starts and again every `REREAD_S`, not at each inventory refresh: topology labels change
when a node is moved, which is rare, and hundreds of nodes reading their Node every few seconds
would load the API server for nothing.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api import KubeApiError, call

log = logging.getLogger("tangram.discovery.topology")

# The label Kubernetes' network topology proposal names; GKE's `cloud.google.com/gce-topology-block`
# or AWS's `topology.k8s.aws/network-node-layer-3` can be named instead (--network-block-label).
NETWORK_BLOCK_LABEL = "network.topology.kubernetes.io/block"
REREAD_S = 60.0
# A label value as the API server accepts it: at most 63 characters, alphanumeric at both ends.
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class NodeTopology:
    """The node's network block: the value of `label` on its Node, "" when it has none; what was
    last read while the API server cannot be asked."""

    def __init__(self, api: Any, *, node: str, label: str, request_timeout_s: float = 10.0) -> None:
        self._core = CoreV1Api(api)
        self._node = node
        self._label = label
        self._timeout = request_timeout_s
        self._block = ""
        self._read_at: float | None = None

    async def network_block(self) -> str:
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < REREAD_S:
            return self._block
        try:
            node = await call(
                f"read Node {self._node}", self._core.read_node(self._node, _request_timeout=self._timeout)
            )
        except KubeApiError as error:
            log.warning("network block not read", extra={"node": self._node, "error": str(error)})
            return self._block
        self._read_at = now
        value = str((node.metadata.labels or {}).get(self._label, ""))
        if not LABEL_VALUE.match(value):  # the API server validates label values; checked all the same
            log.error("network block label unreadable", extra={"label": self._label, "value": value[:80]})
            value = ""
        if value != self._block:
            log.info("network block", extra={"label": self._label, "block": value})
        self._block = value
        return value
