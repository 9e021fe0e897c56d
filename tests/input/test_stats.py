"""Streaming statistics: exact where the docstring says exact, within the stated error
where it says approximate, whatever the block sizes."""

import math

import numpy as np
import pytest

from trainer.input import stats


def blocks(values, sizes):
    start = 0
    for size in sizes:
        yield values[start : start + size]
        start += size
    yield values[start:]


@pytest.mark.parametrize("sizes", [[], [1, 1, 1], [7, 100, 3], [999]])
def test_moments_over_blocks_equal_numpy(sizes):
    values = np.random.default_rng(0).normal(1e6, 3.0, size=1000)  # a large offset
    values[[3, 50]] = [np.nan, np.inf]
    moments = stats.Moments()
    for block in blocks(values, sizes):
        moments.update(block)
    finite = values[np.isfinite(values)]
    assert moments.count == 998
    assert moments.mean == pytest.approx(finite.mean(), rel=1e-12)
    assert moments.std == pytest.approx(finite.std(), rel=1e-9)
    assert (moments.min, moments.max) == (finite.min(), finite.max())


def test_quantile_sample_is_the_whole_column_while_it_fits():
    sample = stats.QuantileSample(capacity=100, seed=1)
    values = np.arange(90.0)
    for block in blocks(values, [30, 30]):
        sample.update(block)
    np.testing.assert_array_equal(sample.values, values)


def test_quantile_sample_quantiles_are_within_the_stated_rank_error():
    rng = np.random.default_rng(3)
    values = rng.exponential(size=400_000)
    sample = stats.QuantileSample(capacity=10_000, seed=7)
    for block in blocks(values, [8192] * 48):
        sample.update(block)
    assert sample.values.size == 10_000
    ranks = np.searchsorted(np.sort(values), np.quantile(sample.values, [0.1, 0.25, 0.5, 0.9]))
    error = np.abs(ranks / values.size - [0.1, 0.25, 0.5, 0.9])
    assert error.max() < 3 / (2 * math.sqrt(10_000))  # three standard deviations


def test_quantile_sample_is_reproducible():
    values = np.random.default_rng(0).normal(size=50_000)

    def sample():
        s = stats.QuantileSample(capacity=1000, seed=5)
        for block in blocks(values, [4096] * 12):
            s.update(block)
        return s.values

    np.testing.assert_array_equal(sample(), sample())


def test_counter_is_exact_under_its_capacity():
    counter = stats.Counter(capacity=10)
    counter.update(np.array([b"a", b"b"]), [3, 1])
    counter.update(np.array([b"b", b"c"]), [4, 2])
    assert counter.is_exact and counter.rows == 10
    assert counter.most_common(2) == [(b"b", 5), (b"a", 3)]
    assert counter.most_common(10) == [(b"b", 5), (b"a", 3), (b"c", 2)]


def test_counter_over_capacity_keeps_the_frequent_values_within_its_error_bound():
    rng = np.random.default_rng(0)
    frequent = [f"f{i}".encode() for i in range(20)]
    rows = np.concatenate(
        [
            rng.choice(frequent, size=20_000),  # 1,000 each
            np.array([f"r{i}".encode() for i in range(30_000)]),
        ]
    )  # once each
    rng.shuffle(rows)
    counter = stats.Counter(capacity=100)
    for block in blocks(rows, [1000] * 50):
        distinct, counts = np.unique(block, return_counts=True)
        counter.update(distinct, counts)
    assert not counter.is_exact
    assert counter.max_count_error <= counter.rows / (counter.capacity + 1)
    kept = dict(counter.most_common(20))
    assert set(kept) == set(frequent)
    true = {v: int((rows == v).sum()) for v in frequent}
    for value, count in kept.items():
        assert true[value] - counter.max_count_error <= count <= true[value]


def test_label_values():
    label = stats.LabelValues(max_distinct=3)
    label.update(
        np.array([b"1", b"0"]), [2, 1], np.array([1.0, 1.0, 0.0]), np.array([True, True, True])
    )
    assert label.all_numbers and label.non_integral == 0 and not label.overflowed
    assert label.distinct == {b"1": 2, b"0": 1}
    label.update(
        np.array([b"2.5", b"x", b"y"]),
        [1, 1, 1],
        np.array([2.5, np.nan, np.nan]),
        np.array([True, False, False]),
    )
    assert label.overflowed and not label.all_numbers and label.non_integral == 1
    assert label.moments.count == 4
