"""The preprocessing layer: raw feature columns in; dense float32 features and embedding ids out.

The same module encodes the input pipeline's batches and sits at the front of the exported
model, so training and serving cannot disagree about the encoding.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from trainer.input import schema as schema_lib
from trainer.input.schema import CategoricalColumn, Encoding, Kind, NumericColumn

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
_COMPACT_KEYS = ("numeric", "index", "ids")


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
        for column in self._schema.columns:
            value = features[column.name]
            if isinstance(column, NumericColumn):
                numeric.append(tf.cast(value, tf.float32))
                continue
            looked_up = self._tables[column.name].lookup(tf.strings.strip(value))
            (ids if column.encoding is Encoding.EMBEDDING else index).append(looked_up)
        parts = {"numeric": numeric, "index": index, "ids": ids}
        compact = {k: tf.stack(v, axis=1) for k, v in parts.items() if v}
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
    for column in schema.columns:
        if isinstance(column, NumericColumn):
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
