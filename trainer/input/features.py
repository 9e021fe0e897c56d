"""The preprocessing layer: raw feature columns in; dense float32 features and embedding ids out.

The same module encodes the input pipeline's batches and sits at the front of the exported
model, so training and serving cannot disagree about the encoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import tensorflow as tf

from trainer.input import dates
from trainer.input import schema as schema_lib
from trainer.input.schema import CategoricalColumn, DateColumn, Encoding, Kind, NumericColumn

# One batch, encoded: "dense" [batch, schema.dense_width] float32 and, with embedded columns,
# "ids" [batch, number of embedded columns] int64 (each column's id into its vocabulary, the
# last id for values outside it). A dict without "ids" rather than a None or a zero-width
# tensor: tf.data and distributed iterators handle neither.
Encoded = Mapping[str, tf.Tensor]
# The input pipeline's encoded batches of a schema with a weight column also hold each row's
# weight, [batch] float32, under this key: the loss and the metrics read it, the model never
# does (the exported model's preprocessor makes no weight).
WEIGHT = "weight"
# An in-memory training table's rows may also carry the frozen previous ensemble's members'
# outputs, a tuple of (last layer, logits) per member, under this key: computed once per
# iteration (`Iteration.previous_outputs`), read by the forward pass instead of running the
# members at every step.
PREVIOUS_OUTPUTS = "previous_outputs"
# Or, when no mixture weights of the iteration read the members' last layers, their logits
# alone, a tuple of one tensor per member (a binary head: 1 float a member, not 65).
PREVIOUS_LOGITS = "previous_logits"
# And the new fitted members' logits (boosted trees: fixed once fitted), a tuple of one tensor
# per fitted member, in the order of the iteration's subnetworks, each row's held-out ones.
FITTED_LOGITS = "fitted_logits"
# The keys of `Preprocessor.compact`'s half-encoded rows.
_COMPACT_KEYS = ("numeric", "index", "ids", "dates")


def encoded(dense: tf.Tensor, ids: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    return {"dense": dense} if ids is None else {"dense": dense, "ids": ids}


class Preprocessor(tf.Module):
    """Encodes raw columns: numerics standardised plus a piecewise-linear encoding over
    quantile bins, missing values (NaN, infinite) at the mean and, for a column with an
    indicator, flagged 1 there; categoricals one-hot over the vocabulary with
    one out-of-vocabulary slot, or (large vocabularies) as ids for the subnetworks'
    embeddings. Its lookup tables are created with it, so build it where it is used (an input
    pipeline on a worker builds its own)."""

    def __init__(self, schema: schema_lib.Schema):
        super().__init__(name="preprocessor")
        self._schema = schema
        self._tables = {}
        for column in schema.columns:
            if isinstance(column, CategoricalColumn):
                init = tf.lookup.KeyValueTensorInitializer(
                    tf.constant(column.vocabulary or ("",), tf.string),
                    tf.range(max(1, len(column.vocabulary)), dtype=tf.int64),
                )
                self._tables[column.name] = tf.lookup.StaticHashTable(
                    init, default_value=len(column.vocabulary)
                )

    @property
    def schema(self) -> schema_lib.Schema:
        return self._schema

    def input_signature(self) -> dict[str, tf.TensorSpec]:
        """One rank-1 tensor per raw column: float32 for numeric, string for categorical."""
        return {
            c.name: tf.TensorSpec(
                [None], tf.float32 if c.kind is Kind.NUMERIC else tf.string, name=c.name
            )
            for c in self._schema.columns
        }

    def __call__(self, features: dict[str, tf.Tensor]) -> Encoded:
        return expand(self._schema, self.compact(features))

    def compact(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The encoding's first half: the numeric columns as floats (a missing value as read:
        NaN), "numeric" [batch, numeric columns]; the categorical ones as indices into their
        vocabularies, "index" [batch, one-hot columns] and "ids" [batch, embedded columns]
        (keys without columns left out). A few numbers per row where the encoded row holds
        each numeric's bins and each category's one-hot slots: what an in-memory table keeps
        of a large table (`trainer.input.job_input`)."""
        numeric: list[tf.Tensor] = []
        index: list[tf.Tensor] = []
        ids: list[tf.Tensor] = []
        encoded_dates: list[tf.Tensor] = []
        for column in self._schema.columns:
            value = features[column.name]
            if isinstance(column, NumericColumn):
                numeric.append(tf.cast(value, tf.float32))
                continue
            if isinstance(column, DateColumn):
                encoded_dates.append(date_features(value, column))
                continue
            looked_up = self._tables[column.name].lookup(tf.strings.strip(value))
            (ids if column.encoding is Encoding.EMBEDDING else index).append(looked_up)
        parts = {"numeric": numeric, "index": index, "ids": ids}
        compact = {k: tf.stack(v, axis=1) for k, v in parts.items() if v}
        if encoded_dates:
            compact["dates"] = tf.concat(encoded_dates, axis=1)
        if not compact:  # (a schema of no columns cannot be made: the label is one)
            raise ValueError("no feature columns")
        return compact


def expand(schema: schema_lib.Schema, compact: Mapping[str, tf.Tensor]) -> Encoded:
    """The encoding's second half, from `Preprocessor.compact`'s output (other keys pass
    through): each numeric standardised (a missing value at the mean), its missing indicator
    (where it has one) and its piecewise-linear bins, each one-hot column
    over its vocabulary and one out-of-vocabulary slot, in the schema's column order. Needs
    no lookup table: it runs anywhere, e.g. in a dataset's map over an in-memory table."""
    parts = []
    numeric = iter(tf.unstack(compact["numeric"], axis=1)) if "numeric" in compact else None
    index = iter(tf.unstack(compact["index"], axis=1)) if "index" in compact else None
    date_at = 0
    for column in schema.columns:
        if isinstance(column, DateColumn):
            parts.append(compact["dates"][:, date_at : date_at + column.width])
            date_at += column.width
        elif isinstance(column, NumericColumn):
            assert numeric is not None
            raw = next(numeric)
            present = tf.math.is_finite(raw)
            value = tf.where(present, raw, column.mean)
            parts.append(tf.expand_dims((value - column.mean) / column.std, -1))
            if column.indicator:
                parts.append(tf.expand_dims(1.0 - tf.cast(present, tf.float32), -1))
            if column.num_bins:
                parts.append(_piecewise_linear(value, column.edges))
        elif column.encoding is not Encoding.EMBEDDING:
            assert index is not None
            parts.append(tf.one_hot(next(index), column.width))
    first = next(compact[k] for k in _COMPACT_KEYS if k in compact)
    dense = tf.concat(parts, axis=-1) if parts else tf.zeros([tf.shape(first)[0], 0])
    rest = {k: v for k, v in compact.items() if k not in _COMPACT_KEYS}
    return {**rest, **encoded(dense, compact.get("ids"))}


def _piecewise_linear(value: tf.Tensor, edges: tuple[float, ...]) -> tf.Tensor:
    """Piecewise-linear encoding (Gorishniy et al., 2022): component t is 0 below bin t, 1
    above it, and the position within it in between. A thermometer code that keeps the
    position inside the bin, so a linear layer on top fits any piecewise-linear function."""
    low = tf.constant(edges[:-1], tf.float32)
    width = tf.constant([b - a for a, b in zip(edges[:-1], edges[1:])], tf.float32)
    return tf.clip_by_value((value[:, None] - low) / width, 0.0, 1.0)


def date_features(text: tf.Tensor, column: DateColumn) -> tf.Tensor:
    """A date column's encoding [batch, column.width] from its text (`trainer/input/dates.py`:
    the same rewrites to the canonical form, then fixed-position fields): standardised UTC
    seconds and year, month, day of month, weekday and (with times) time of day as sine and
    cosine, then 1 where the value is missing (every other part then 0)."""
    value = tf.strings.strip(text)
    for pattern, replacement in dates.rewrites(column.format):
        value = tf.strings.regex_replace(value, pattern, replacement)
    shaped = tf.strings.regex_full_match(value, dates.CANONICAL)
    value = tf.where(shaped, value, "1970-01-01T00:00:00+0000")

    def field(start: int, length: int) -> tf.Tensor:
        return tf.strings.to_number(tf.strings.substr(value, start, length), tf.int64)

    year, month, day = field(0, 4), field(5, 2), field(8, 2)
    hour, minute, second = field(11, 2), field(14, 2), field(17, 2)
    sign = tf.where(tf.strings.substr(value, 19, 1) == "+", 1, -1)
    offset = tf.cast(sign, tf.int64) * (field(20, 2) * 3600 + field(22, 2) * 60)
    days = _days_from_civil(year, month, day)
    valid = (
        shaped
        & (month >= 1)
        & (month <= 12)
        & (day >= 1)
        & (day <= _days_in_month(year, month))
        & (hour <= 23)
        & (minute <= 59)
        & (second <= 60)
    )
    seconds = tf.cast(days * 86400 + hour * 3600 + minute * 60 + second - offset, tf.float64)
    weekday = tf.math.floormod(days + 3, 7)  # 1970-01-01 was a Thursday; Monday is 0

    def circle(position: tf.Tensor, period: float) -> list[tf.Tensor]:
        angle = 2.0 * math.pi * tf.cast(position, tf.float32) / period
        return [tf.sin(angle), tf.cos(angle)]

    parts = [
        tf.cast((seconds - column.mean) / column.std, tf.float32),
        tf.cast((tf.cast(year, tf.float64) - column.year_mean) / column.year_std, tf.float32),
        *circle(month - 1, 12.0),
        *circle(day - 1, 31.0),
        *circle(weekday, 7.0),
    ]
    if column.has_time:
        parts += circle(tf.cast(hour, tf.float32) + tf.cast(minute, tf.float32) / 60.0, 24.0)
    encoded = tf.stack(parts, axis=1)
    encoded = tf.where(valid[:, None], encoded, tf.zeros_like(encoded))
    return tf.concat([encoded, 1.0 - tf.cast(valid, tf.float32)[:, None]], axis=1)


def _days_from_civil(year: tf.Tensor, month: tf.Tensor, day: tf.Tensor) -> tf.Tensor:
    """Days since 1970-01-01 of a proleptic Gregorian date (int64 tensors), by counting
    400-year eras from March (so that a leap day ends the year)."""
    y = year - tf.cast(month <= 2, tf.int64)
    era = tf.math.floordiv(y, 400)
    year_of_era = y - era * 400
    shifted_month = tf.math.floormod(month + 9, 12)  # March 0 .. February 11
    day_of_year = (153 * shifted_month + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _days_in_month(year: tf.Tensor, month: tf.Tensor) -> tf.Tensor:
    leap = (tf.math.floormod(year, 4) == 0) & (
        (tf.math.floormod(year, 100) != 0) | (tf.math.floormod(year, 400) == 0)
    )
    lengths = tf.constant([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], tf.int64)
    length = tf.gather(lengths, tf.clip_by_value(month - 1, 0, 11))
    return length + tf.cast(leap & (month == 2), tf.int64)
