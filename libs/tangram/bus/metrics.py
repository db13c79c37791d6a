"""Prometheus metrics of the bus client, shared by every service."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

PUBLISHED = Counter("tangram_bus_published_total", "Events acknowledged by JetStream", ["type"])
DUPLICATES = Counter("tangram_bus_duplicates_total", "Publishes JetStream reported as duplicates", ["type"])
CONSUMED = Counter(
    "tangram_bus_consumed_total", "Messages handled by a consumer, by outcome", ["consumer", "outcome"]
)
SKIPPED = Counter(
    "tangram_bus_skipped_total",
    "Messages a replay or follow went past: undecodable, or refused by the state they fold into",
    ["stream", "why"],
)
DEAD_LETTERS = Counter("tangram_bus_dead_letters_total", "Messages sent to the dead letter", ["consumer"])
HANDLE_SECONDS = Histogram(
    "tangram_bus_handle_seconds",
    "Time a handler took per message",
    ["consumer"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
)
