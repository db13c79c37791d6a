"""Prometheus metrics of MIG reconfiguration."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONFIGURE_SECONDS = Histogram(
    "tangram_partition_seconds",
    "Time to apply one partition command, by action",
    ["action"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
FAILURES = Counter(
    "tangram_partition_failures_total",
    "Partition commands that failed, by NVML error name (none when NVML was not the cause)",
    ["action", "nvml_error"],
)
INSTANCES = Gauge("tangram_mig_instances", "MIG instances on this node, by profile", ["profile"])
ORPHANS = Counter("tangram_partition_orphans_total", "Instances found at start-up, by kind", ["kind"])
# A command held until this node reads a claim's release: non-zero for long means the node's view
# of the log lags (after a NATS outage), and commands wait up to the log-lag bound.
WAITING_FOR_RELEASE = Gauge(
    "tangram_partition_commands_waiting_for_release",
    "Partition commands waiting for this node to read the release of the claim holding their slices",
)
