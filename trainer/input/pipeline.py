"""The input pipeline on tf.data: the datasets training, evaluation and prediction read.

    files -> blocks of rows (several files in turn) -> [a window of rows, permuted whole]
    -> select (hold-out, shard) -> parse + encode (a block at a time, in parallel) -> batches
    -> prefetch

Rows are parsed and encoded in blocks by the same preprocessing layer the exported model
carries; with a weight column, the encoded features also hold each row's weight under
`features.WEIGHT` (scaled by 1 / the training mean, see `schema.Weight`), which the loss and
the metrics read and the model never sees. Memory is bounded by the read, shuffle and
prefetch buffers, never by the number of rows. When a reader's share of the encoded training
data fits `cache_bytes`, it is read once and kept in memory, and every epoch draws a new
permutation of it (small tables train as fast as from an array).

Which rows a dataset takes (`Selection`): the hold-out (a keyed hash of each row's file and
line, see `scan.Holdout`) and a shard. A shard is whole files when there are at least as many
files as readers, else every n-th row of every file by line number; either way no row is read
by two readers of one pass.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable

import tensorflow as tf

from trainer.input import rows as rows_lib
from trainer.input import schema as schema_lib
from trainer.input.features import WEIGHT, Preprocessor
from trainer.input.formats.base import Source
from trainer.input.options import BadRows
from trainer.input.rows import Columns
from trainer.input.scan import Holdout

# Rows parsed together: the per-block cost of a parse (~100 ops) is paid once per block.
PARSE_BLOCK_ROWS = 4096
# Files whose rows are mixed in one shuffle window.
_FILES_MIXED = 4
EVAL_BATCH_SIZE = 4096


def _untuned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` without tf.data's autotuning thread. With it (TF 2.17), deleting an iterator
    can wait for that thread's next optimization round, whose period doubles up to 60 s:
    every iteration of the search drops its training iterator, and on 2 busy cores that took
    4.5 to 9.5 s (one run in two). Without it, `AUTOTUNE` parallelism is the number of cores
    (at most 16) and prefetch buffers still grow with demand."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


@dataclasses.dataclass(frozen=True)
class Derived:
    """Columns computed from an in-memory table's encoded rows once, then batched with them:
    `fn(features of some rows) -> {key: a tensor, or a tuple of them, per row}`, and the
    memory they take per row."""

    fn: Callable[[dict], dict]
    bytes_per_example: int

    def __call__(
        self, features: dict, *, chunk: int = EVAL_BATCH_SIZE, expand: Callable | None = None
    ) -> dict:
        """`features` with the derived columns, computed `chunk` rows at a time (`expand`:
        what makes the encoded rows of a compact table's, `Preprocessor.expand`)."""
        rows = int(tf.shape(tf.nest.flatten(features)[0])[0])
        expand = expand or (lambda f: f)
        parts = [
            self.fn(expand({k: v[start : start + chunk] for k, v in features.items()}))
            for start in range(0, rows, chunk)
        ]
        return {**features, **tf.nest.map_structure(lambda *p: tf.concat(p, 0), *parts)}


class Side(str, enum.Enum):
    """Which rows of a source with a hold-out a dataset takes."""

    ALL = "all"
    TRAIN = "train"  # the rows not held out
    HELD_OUT = "held_out"


@dataclasses.dataclass(frozen=True)
class Shard:
    """Reader `index` of `count`: whole files (`by_file`) or every count-th row by line."""

    index: int | tf.Tensor
    count: int
    by_file: bool

    @classmethod
    def of(cls, index, count: int, *, num_files: int) -> Shard | None:
        if count <= 1:
            return None
        return cls(index, count, by_file=num_files >= count)

    def describe(self, source: Source) -> dict:
        """What this reader reads (index must be a number), for the report."""
        if self.by_file:
            return {"files": list(source.files[self.index :: self.count])}
        return {
            "rows": f"every row whose line number is {self.index} modulo {self.count}, "
            f"in all {len(source.files)} files"
        }


def shard_plan(source: Source, count: int) -> list[dict]:
    """What each of `count` readers reads (one entry per reader)."""
    if count <= 1:
        return [{"files": "all"}]
    by_file = len(source.files) >= count
    return [Shard(i, count, by_file=by_file).describe(source) for i in range(count)]


@dataclasses.dataclass(frozen=True)
class Selection:
    """The rows a dataset takes: a side of the hold-out and a shard."""

    holdout: Holdout | None = None
    side: Side = Side.ALL
    shard: Shard | None = None

    def __post_init__(self):
        if (self.side is Side.ALL) != (self.holdout is None):
            raise ValueError("a hold-out side needs a hold-out, and a hold-out a side.")

    def files(self, source: Source) -> tf.data.Dataset:
        files = source.indexed_files()
        if self.shard and self.shard.by_file:
            files = files.shard(self.shard.count, self.shard.index)
        return files

    def keep(self, source: Source, file: tf.Tensor, line: tf.Tensor) -> tf.Tensor:
        """Which rows of a block are selected (decided before they are parsed: an eval pass
        over a 10% hold-out parses a tenth of the rows it reads)."""
        keep = tf.ones(tf.shape(line), tf.bool)
        if self.shard and not self.shard.by_file:
            keep &= tf.equal(line % self.shard.count, tf.cast(self.shard.index, tf.int64))
        if self.holdout is not None:
            held = self.holdout.held_out(*source.origin(file, line))
            keep &= held if self.side is Side.HELD_OUT else ~held
        return keep


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """Datasets of one source under the schema."""

    source: Source
    schema: schema_lib.Schema
    bad_rows: BadRows = BadRows.ERROR
    in_process: bool = True  # False: a dataset a parameter-server worker runs (no Python)

    # -- parsing ----------------------------------------------------------------------------
    def _cut_files(self) -> dict:
        """How `Source.blocks` reads this source's files cut short: the statistics pass
        stopped the job on one, or (`--bad_rows=skip`) found where each ends; the reader
        stops there too (in Python it finds it again; TensorFlow's line reader, a
        parameter-server worker's, is told)."""
        skip = self.bad_rows is BadRows.SKIP
        if self.in_process or not skip:
            return {"in_process": self.in_process, "lost_tails": skip}
        ends = {
            entry["path"]: entry["lost_tail_after_line"]
            for key in ("train", "eval")
            for entry in (self.schema.summary.get(key) or {}).get("files", ())
            if "lost_tail_after_line" in entry
        }
        last_lines = [ends.get(path) for path in self.source.files] if ends else None
        return {"in_process": False, "lost_tails": True, "last_lines": last_lines}

    def _readers(self, count: int) -> int:
        return max(1, min(len(self.source.files), os.cpu_count() or 2, 8, count))

    def _rows(self, selection: Selection, *, deterministic: bool) -> tf.data.Dataset:
        return self.source.blocks(
            selection.files(self.source),
            parallel=self._readers(len(self.source.files)),
            deterministic=deterministic,
            **self._cut_files(),
        )

    def _parse_fn(
        self, selection: Selection, *, with_label: bool = True, with_weight: bool = False
    ) -> Callable:
        """fn(file, line, text) -> (raw features, labels): the selected rows that can be used
        (bad rows are skipped, or with `BadRows.ERROR` fail the pipeline naming the first).
        Labels are class ids (int64) or regression targets (float32). With a weight column,
        labelled rows whose weight is not a number >= 0 are bad rows too, and `with_weight`
        gives (raw features, labels, weights), the weights as the data has them."""
        schema, label = self.schema, self.schema.label
        weight = schema.weight.name if with_label and schema.weight else None
        columns = Columns(
            schema.numeric_names,
            schema.categorical_names,
            label.name if with_label else None,
            weight,
        )
        parser = rows_lib.RowParser(self.source, columns)
        classes = None
        if with_label and not label.is_regression:
            classes = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(label.classes), tf.range(len(label.classes), dtype=tf.int64)
                ),
                -1,
            )
        files = tf.constant(self.source.files)

        def parse(file, line, text):
            selected = selection.keep(self.source, file, line)
            file, line, text = (tf.boolean_mask(t, selected) for t in (file, line, text))
            parsed = parser.parse(file, line, text)
            reasons = rows_lib.feature_reasons(parsed)
            labels = None
            if with_label:
                reasons |= rows_lib.label_reasons(parsed, regression=label.is_regression)
                if classes is not None:
                    labels = classes.lookup(parsed.label_text)
                    reasons |= tf.where(
                        (labels < 0) & tf.equal(reasons, 0), rows_lib.LABEL_UNKNOWN, 0
                    )
                else:
                    labels = tf.cast(parsed.label_value, tf.float32)
            if weight:
                reasons |= rows_lib.weight_reasons(parsed)
            keep = ~parsed.blank
            bad = keep & tf.not_equal(reasons, 0)
            if self.bad_rows is BadRows.ERROR:
                where, number, why = rows_lib.first_where(bad, file, line, reasons)
                tf.debugging.Assert(
                    ~tf.reduce_any(bad),
                    [
                        "a row that cannot be used:",
                        tf.gather(files, where),
                        "line",
                        number,
                        "reason bits",
                        why,
                        "(the input changed since its scan? pass "
                        "--bad_rows=skip to skip such rows)",
                    ],
                )
            keep &= ~bad
            parsed = parsed.take(keep)
            if not with_label:
                return parsed.features()
            if weight and with_weight:
                return parsed.features(), tf.boolean_mask(labels, keep), parsed.weight
            return parsed.features(), tf.boolean_mask(labels, keep)

        return tf.autograph.experimental.do_not_convert(parse)

    def _encode_fn(self, selection: Selection, *, compact: bool = False) -> Callable:
        """Parses and encodes a block of rows (`compact`: `Preprocessor.compact`'s half)."""
        weight = self.schema.weight
        parse = self._parse_fn(selection, with_weight=weight is not None)
        preprocessor = Preprocessor(self.schema)
        encoding = preprocessor.compact if compact else preprocessor

        def encode(file, line, text):
            if weight is None:
                features, labels = parse(file, line, text)
                return encoding(features), labels
            features, labels, weights = parse(file, line, text)
            return {**encoding(features), WEIGHT: weights / weight.mean}, labels

        return tf.autograph.experimental.do_not_convert(encode)

    # -- datasets ---------------------------------------------------------------------------
    def encoded(
        self,
        selection: Selection = Selection(),
        *,
        batch_size: int = EVAL_BATCH_SIZE,
        deterministic: bool = False,
        compact: bool = False,
    ) -> tf.data.Dataset:
        """One pass, in batches of at most `batch_size`: `(encoded features, labels)` (in
        the files' order if `deterministic`; `compact`: `Preprocessor.compact`'s features)."""
        return self._pass(
            selection,
            self._encode_fn(selection, compact=compact),
            batch_size=batch_size,
            deterministic=deterministic,
        )

    def raw(
        self,
        selection: Selection = Selection(),
        *,
        batch_size: int = EVAL_BATCH_SIZE,
        with_label: bool = True,
        with_weight: bool = False,
    ) -> tf.data.Dataset:
        """One pass of raw features as the serving signature takes them: `(features, labels)`,
        or `features` alone without `with_label`; `(features, labels, weights)` with
        `with_weight` when the schema has a weight column."""
        return self._pass(
            selection,
            self._parse_fn(selection, with_label=with_label, with_weight=with_weight),
            batch_size=batch_size,
            deterministic=False,
        )

    def table(self, selection: Selection, *, rows: int, compact: bool = False) -> tf.data.Dataset:
        """The selected rows (at most `rows`), encoded (`compact`: half-encoded, see
        `Preprocessor.compact`), as one element `(features, labels)`: read in the files'
        order, so that the same seed permutes them the same way."""
        encoded = self.encoded(
            selection, batch_size=PARSE_BLOCK_ROWS, deterministic=True, compact=compact
        )
        return encoded.rebatch(max(rows, 1)).take(1)

    def _pass(
        self, selection: Selection, fn: Callable, *, batch_size: int, deterministic: bool
    ) -> tf.data.Dataset:
        return (
            self._rows(selection, deterministic=deterministic)
            .rebatch(PARSE_BLOCK_ROWS)
            .map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
            .rebatch(batch_size)
            .prefetch(2)
        ).apply(_untuned)

    def training(
        self,
        selection: Selection,
        *,
        batch_size: int,
        seed: int,
        shuffle_buffer: int,
        cache_rows: int | None,
    ) -> tf.data.Dataset:
        """Endless shuffled batches of `batch_size` (`(encoded features, labels)`).

        With `cache_rows` (an upper bound of the rows this reader takes, given when they fit
        the memory budget), the rows are read and encoded once and held in memory; each epoch
        is a new permutation of them. Otherwise rows stream from the files, in a new file
        order each epoch, up to `_FILES_MIXED` files at a time, and each window of
        `shuffle_buffer` rows is shuffled whole.
        """
        if cache_rows is not None:
            return in_memory(self.table(selection, rows=cache_rows).cache(), batch_size, seed)
        files = (
            selection.files(self.source)
            .shuffle(len(self.source.files), seed=seed, reshuffle_each_iteration=True)
            .repeat()
        )
        rows = self.source.blocks(
            files,
            parallel=self._readers(len(self.source.files)),
            deterministic=False,
            cycle=min(len(self.source.files), _FILES_MIXED),
            **self._cut_files(),
        )
        encode = self._encode_fn(selection)

        def shuffle_and_encode(number, block):
            file, line, text = block
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.size(text)), seed=tf.stack([tf.constant(seed, tf.int64), number])
            )
            return encode(*(tf.gather(t, order) for t in (file, line, text)))

        # A window of `shuffle_buffer` rows (from several files) is permuted whole, parsed
        # and encoded in one call: per-row tf.data elements (unbatch, shuffle) cost more CPU
        # than the parse itself.
        return (
            rows.rebatch(shuffle_buffer)
            .enumerate()
            .map(shuffle_and_encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            .rebatch(batch_size, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
            .apply(_untuned)
        )


def in_memory(
    table: tf.data.Dataset, batch_size: int, seed: int, expand: Callable | None = None
) -> tf.data.Dataset:
    """Endless batches gathered from `table`'s one element (`Pipeline.table`, cached, or its
    tensors held by the process), in a new permutation per epoch (epoch e of seed s permutes
    with the stateless seed (s, e)); `expand` makes each batch's encoded features of a
    compact table's (`Preprocessor.expand`)."""
    expand = expand or (lambda f: f)

    def epoch(data, number):
        features, labels = data
        count = tf.shape(labels, out_type=tf.int64)[0]
        steps = count // batch_size
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count), seed=tf.stack([tf.constant(seed, tf.int64), number])
        )
        batches = tf.reshape(order[: steps * batch_size], [steps, batch_size])
        return tf.data.Dataset.from_tensor_slices(batches).map(
            lambda i: (
                expand(tf.nest.map_structure(lambda v: tf.gather(v, i), features)),
                tf.gather(labels, i),
            )
        )

    return (
        tf.data.Dataset.zip(table.repeat(), tf.data.Dataset.counter())
        .flat_map(epoch)
        .prefetch(tf.data.AUTOTUNE)
        .apply(_untuned)
    )
