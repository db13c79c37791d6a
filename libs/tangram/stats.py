"""The one percentile every figure Tangram reports uses (decision times, latencies, benchmarks)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th quantile (0 <= q <= 1) by linear interpolation between the closest ranks: the
    median at 0.5, the largest value at 1; what numpy and `statistics.quantiles(method="inclusive")`
    compute, so figures compare across benchmarks and tools."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not between 0 and 1")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values to take a percentile of")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    """The p50 and p99 of latencies in milliseconds, as every benchmark reports them."""
    return {"p50_ms": round(percentile(samples_ms, 0.5), 3), "p99_ms": round(percentile(samples_ms, 0.99), 3)}
