"""The one percentile: linear between the closest ranks, worked by hand."""

from __future__ import annotations

import statistics

import pytest

from tangram.stats import percentile


def test_the_median_and_the_extremes() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0
    assert percentile([7.0], 0.99) == 7.0


def test_p99_lies_between_the_two_closest_ranks() -> None:
    # 101 values 0..100: rank 99 exactly; 4 values: 2.97 of the way, between 3 and 4
    assert percentile([float(v) for v in range(101)], 0.99) == 99.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.99) == pytest.approx(3.97)


def test_it_agrees_with_the_standard_library_inclusive_method() -> None:
    values = [0.3, 9.1, 2.2, 7.7, 5.0, 1.4, 8.8]
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    assert inclusive[98] == pytest.approx(percentile(values, 0.99))


def test_nothing_to_measure_or_a_quantile_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        percentile([1.0], 99)
