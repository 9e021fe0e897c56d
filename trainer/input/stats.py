"""Streaming statistics in bounded memory: numeric moments and a quantile sample, category
counts, and the label's values. Pure numpy, fed one parsed block at a time by `scan.py`.

Exact where exact figures fit in bounded memory, approximate (with a stated error) where they
would grow with the data:

- Counts, means, standard deviations, minima and maxima are exact (float64, merged per block
  with Chan et al.'s pairwise update, so a long stream does not lose precision).
- Quantiles come from a uniform random sample of `QUANTILE_SAMPLE` values per column (a
  seeded bottom-k sample, so the same data give the same sample). A column with at most that
  many values is sampled whole, and its quantiles are exact. Otherwise the rank of a sample
  quantile is off by about 1/(2*sqrt(k)) = 0.16% of the rows (one standard deviation), under
  0.5% with 99.7% probability: a bin edge meant for the 25% quantile lands between 24.5% and
  25.5%.
- Category counts are exact while a column has at most `capacity` distinct values. Past that,
  a Misra-Gries summary keeps the `capacity` most frequent ones: each kept count is low by at
  most `max_count_error` (at most rows / (capacity + 1)), and every value more frequent than
  that is kept.
"""

from __future__ import annotations

import math

import numpy as np

QUANTILE_SAMPLE = 100_000


class Moments:
    """Count, mean, variance, minimum and maximum of a stream of numbers (NaN skipped)."""

    def __init__(self):
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the mean
        self.min = math.inf
        self.max = -math.inf

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.float64)
        values = values[np.isfinite(values)]
        n = values.size
        if not n:
            return
        mean = float(values.mean())
        m2 = float(np.square(values - mean).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self._m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    @property
    def std(self) -> float:
        """The population standard deviation (numpy's default)."""
        return math.sqrt(self._m2 / self.count) if self.count else 0.0


class QuantileSample:
    """A uniform random sample of at most `capacity` values of a stream (NaN skipped): each
    value gets a random priority and the `capacity` lowest priorities are kept."""

    def __init__(self, capacity: int = QUANTILE_SAMPLE, *, seed: int = 0):
        self.capacity = capacity
        self._rng = np.random.default_rng(seed)
        self._values: list[np.ndarray] = []
        self._priorities: list[np.ndarray] = []
        self._size = 0
        self._threshold = math.inf  # a new value needs a lower priority to get in

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.float64)
        values = values[np.isfinite(values)]
        priorities = self._rng.random(values.size)
        keep = priorities < self._threshold
        if not keep.all():
            values, priorities = values[keep], priorities[keep]
        if not values.size:
            return
        self._values.append(values)
        self._priorities.append(priorities)
        self._size += values.size
        # Trimmed back to `capacity` only once twice that has gathered: linear time overall.
        if self._size >= 2 * self.capacity:
            self._trim()

    def _trim(self) -> None:
        values = np.concatenate(self._values) if self._values else np.zeros(0)
        priorities = np.concatenate(self._priorities) if self._priorities else np.zeros(0)
        if values.size > self.capacity:
            lowest = np.argpartition(priorities, self.capacity - 1)[: self.capacity]
            values, priorities = values[lowest], priorities[lowest]
            self._threshold = float(priorities.max())
        self._values, self._priorities, self._size = [values], [priorities], values.size

    @property
    def values(self) -> np.ndarray:
        self._trim()
        return np.sort(self._values[0])


class Counter:
    """Counts of distinct values, the `capacity` most frequent kept (see the module doc)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.counts: dict[bytes, int] = {}
        self.max_count_error = 0  # what Misra-Gries took off every count so far
        self.rows = 0

    def update(self, values, counts) -> None:
        counts = np.asarray(counts).tolist()
        self.rows += sum(counts)
        table = self.counts
        for value, count in zip(values.tolist() if hasattr(values, "tolist") else values, counts):
            table[value] = table.get(value, 0) + count
        if len(table) > 2 * self.capacity:
            self._prune()

    def _prune(self) -> None:
        """Misra-Gries: take the (capacity+1)-th largest count off every count and drop the
        values left at zero or below."""
        counts = np.fromiter(self.counts.values(), np.int64, len(self.counts))
        cut = int(
            np.partition(counts, counts.size - self.capacity - 1)[counts.size - self.capacity - 1]
        )
        self.max_count_error += cut
        self.counts = {v: c - cut for v, c in self.counts.items() if c > cut}

    @property
    def is_exact(self) -> bool:
        return self.max_count_error == 0

    def most_common(self, n: int) -> list[tuple[bytes, int]]:
        """The `n` most frequent values, by count, then value (a stable order)."""
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


class LabelValues:
    """What the label column holds: its distinct canonical values (up to `max_distinct`),
    whether every present value is a number, whether every number is integral, and the
    numbers' moments."""

    def __init__(self, max_distinct: int):
        self.max_distinct = max_distinct
        self.distinct: dict[bytes, int] = {}
        self.overflowed = False
        self.not_numbers = 0
        self.non_integral = 0
        self.moments = Moments()

    def update(self, texts, counts, numbers: np.ndarray, is_number: np.ndarray) -> None:
        if not self.overflowed:
            for text, count in zip(texts.tolist(), np.asarray(counts).tolist()):
                self.distinct[text] = self.distinct.get(text, 0) + count
            if len(self.distinct) > self.max_distinct:
                self.overflowed, self.distinct = True, {}
        numbers = np.asarray(numbers, np.float64)[np.asarray(is_number, bool)]
        self.not_numbers += int(np.size(is_number) - np.count_nonzero(is_number))
        self.non_integral += int(np.count_nonzero(numbers != np.round(numbers)))
        self.moments.update(numbers)

    @property
    def all_numbers(self) -> bool:
        return self.not_numbers == 0
