"""`tangram_claim_device_info`: which pod's claim holds which GPU or MIG device on this node.

DCGM's exporter labels a GPU by its UUID and a MIG device by its GPU's UUID and GPU instance id,
and knows nothing of claims; this series, one per prepared device and pod, is what Prometheus
joins DCGM's series to (the recording rules in deploy/helm/tangram/files/prometheus/). It is read
from the preparer's prepared claims at every scrape, so a claim's series are gone from the first
scrape after it is unprepared, and a restarted service serves them again from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from tangram.cdi.devices import ResolvedAllocation

INFO_NAME = "tangram_claim_device_info"
INFO_LABELS = (
    "namespace",
    "pod",
    "claim",
    "claim_uid",
    "node",
    "device",
    "gpu_uuid",
    "mig_uuid",
    "gpu_instance_id",
    "profile",
    "share",
)


def device_info_rows(node: str, prepared: Mapping[str, ResolvedAllocation]) -> list[tuple[str, ...]]:
    """One row of label values (in `INFO_LABELS` order) per prepared device and pod of its claim;
    pod "" where the pods are not known (claims not read from Kubernetes)."""
    rows: list[tuple[str, ...]] = []
    for uid, allocation in sorted(prepared.items()):
        claim = allocation.claim
        for pod in allocation.pods or [""]:
            for device in allocation.devices:
                rows.append(
                    (
                        claim.namespace,
                        pod,
                        claim.name,
                        uid,
                        node,
                        device.device,
                        device.gpu_uuid,
                        device.mig_uuid,
                        str(device.gpu_instance_id) if device.is_mig else "",
                        device.profile,
                        device.share.id if device.share is not None else "",
                    )
                )
    return rows


Prepared = Callable[[], Mapping[str, ResolvedAllocation]]


class ClaimDeviceCollector(Collector):
    """The info series of the prepared claims of every plugin serving in this process, read at each
    scrape (several simulated nodes may serve in one process)."""

    def __init__(self) -> None:
        self._sources: dict[object, tuple[str, Prepared]] = {}

    def watch(self, key: object, node: str, prepared: Prepared) -> None:
        self._sources[key] = (node, prepared)

    def forget(self, key: object) -> None:
        self._sources.pop(key, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            INFO_NAME,
            "A device prepared on this node for a pod's claim (1): joins DCGM's GPU and MIG series "
            "to pods and namespaces",
            labels=INFO_LABELS,
        )
        for node, prepared in list(self._sources.values()):
            for row in device_info_rows(node, prepared()):
                family.add_metric(row, 1.0)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(INFO_NAME, "", labels=INFO_LABELS)


CLAIM_DEVICES = ClaimDeviceCollector()
REGISTRY.register(CLAIM_DEVICES)
