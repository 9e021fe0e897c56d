"""The statistics pass: one streaming read of the training data (and a check of the eval data)
before training, done once by the chief. It decides each column's kind and encoding, computes
the statistics the encoding needs, infers the label's head, counts rows per file, and finds
bad rows, all in memory that does not grow with the number of rows (see `stats.py` for the
approximations that keeps).

Column kinds are decided from the first `SAMPLE_ROWS` rows (flags override); the pass then
parses each column as its kind. A row that cannot be used (wrong field count, a numeric feature
that is not a number, a missing or unusable label, a weight that is not a number >= 0) stops
the job, naming its file and line, or with `--bad_rows=skip` is skipped and counted per file.
The weights of the rows used must not all be zero, in the training rows and in the eval rows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.input import blocks as blocks_lib
from trainer.input import rows as rows_lib
from trainer.input import schema as schema_lib
from trainer.input import stats
from trainer.input.bad_rows import BadRowLog, first_bad
from trainer.input.formats.base import FLOAT, INT64, Source
from trainer.input.options import BadRows
from trainer.input.rows import Columns
from trainer.input.schema import ColumnChoices, HeadType, Kind, Schema

SAMPLE_ROWS = 20_000
_HOLDOUT_BUCKETS = 1_000_000


@dataclasses.dataclass(frozen=True)
class Holdout:
    """Rows held out of the training data for evaluation, chosen by a keyed hash of where each
    row is (its file's index in the source and its line or record number): the same rows on
    every replica, in any reading order or sharding, and on resume (which refuses data that
    changed).

    Where a row is, not what it says: with a hash of the row's text, every copy of a duplicated
    row went to one side, and a table of few distinct rows (AER's Fertility: 200k rows, a few
    thousand distinct) got a hold-out whose rows' labels were those the training rows lacked
    (its eval AUC was 0.25 for models that scored 0.63 accuracy on a test split). Copies of a
    row are as likely as any rows to fall on either side, as in a random split.

    `fold` picks which `fraction` of the hash range is held out: the folds of one seed are
    disjoint, so the bags of a bagged job (trainer/job/bagging.py) each hold out other rows."""

    fraction: float
    seed: int
    fold: int = 0

    def __post_init__(self):
        if (self.fold + 1) * self.fraction > 1.0 + 1e-9:
            raise ValueError(f"hold-out fold {self.fold} of {self.fraction:.0%} is past the rows.")

    def held_out(self, file: tf.Tensor, line: tf.Tensor) -> tf.Tensor:
        where = tf.strings.join([tf.strings.as_string(file), tf.strings.as_string(line)], ":")
        bucket = tf.strings.to_hash_bucket_strong(where, _HOLDOUT_BUCKETS, key=[self.seed, 0x5EED])
        low = int(round(self.fold * self.fraction * _HOLDOUT_BUCKETS))
        high = int(round((self.fold + 1) * self.fraction * _HOLDOUT_BUCKETS))
        return (bucket >= low) & (bucket < high) if low else bucket < high

    def describe(self) -> str:
        which = f" (fold {self.fold})" if self.fold else ""
        return f"{self.fraction:.0%} of the training rows held out{which}"


# -- the passes -----------------------------------------------------------------------------
def _reader_threads(source: Source) -> int:
    return max(1, min(len(source.files), os.cpu_count() or 2, 8))


# Blocks parsed op by op before the rest are parsed by a traced function: tracing a pass's
# parse function costs about a second, as much as parsing eight 1 MB blocks op by op. A source
# of up to eight blocks (most test files, census) is never traced; a larger one's first blocks
# are read twice (reading is cheap beside parsing).
EAGER_BLOCKS = 8


def _blocks(
    source: Source,
    fn: Callable,
    *,
    take_rows: int | None = None,
    files: list[int] | None = None,
    notes: blocks_lib.Notes | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """`fn` applied to every block of the source (in a fixed order), as numpy; only to the
    first `take_rows` rows if given. A file cut short yields its whole lines (`notes` says
    where it was cut: `_check_whole`)."""
    dataset = source.blocks(
        source.indexed_files(files),
        parallel=_reader_threads(source),
        deterministic=True,
        lost_tails=True,
        notes=notes,
    )
    if take_rows:  # whole blocks of 4,096: unbatching row by row costs more than parsing
        dataset = dataset.rebatch(4096).take(-(-take_rows // 4096))
    # Not converted by autograph: plain TensorFlow code, and converting it took seconds.
    fn = tf.autograph.experimental.do_not_convert(fn)
    try:
        parsed = 0
        for block in dataset.take(EAGER_BLOCKS).prefetch(2):
            yield {k: v.numpy() for k, v in fn(*block).items()}
            parsed += 1
        if parsed < EAGER_BLOCKS:
            return
        # One parse per core: steadier than AUTOTUNE here (1.9 s against 1.9-2.8 s, 1M rows).
        rest = dataset.skip(EAGER_BLOCKS).map(fn, num_parallel_calls=os.cpu_count() or 2)
        for block in rest.prefetch(2):
            yield {k: v.numpy() for k, v in block.items()}
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
        raise InputError(
            f"{source.flag}: cannot read {source.pattern} as {source.format.reads_as} "
            f"({type(e).__name__}: {e.message.splitlines()[0][:300]})."
        ) from None


def _check_whole(source: Source, policy: BadRows, notes: blocks_lib.Notes) -> None:
    """After a pass over `source` (`notes`): its files that were cut short (or corrupt) stop
    the job, or with `--bad_rows=skip` are reported as lost tails. A truncated file is never
    one bad row: its partial last line was not read."""
    tails = [tail for path in source.files if (tail := notes.lost.get(path))]
    for tail in tails:
        if policy is BadRows.ERROR:
            raise InputError(
                f"{source.flag}: {tail.describe()}. Copy or write it again, leave it out of "
                f"{source.flag}, or pass --bad_rows=skip to use its whole lines."
            )
        logging.warning(
            "%s: %s; its whole lines are used (--bad_rows=skip).", source.flag, tail.describe()
        )


def _sample_kinds(source: Source, choices: ColumnChoices) -> dict[str, Kind]:
    """Each feature column's kind, from the first `SAMPLE_ROWS` rows (flags override). A
    TFRecord feature stored as numbers is numeric unless named categorical."""
    features = [
        c
        for c in source.columns
        if c not in (choices.label, choices.weight) and c not in choices.ignore
    ]
    kinds: dict[str, Kind] = {}
    text_columns = []
    for name in features:
        if source.feature_type(name) in (INT64, FLOAT):
            kinds[name] = Kind.CATEGORICAL if name in choices.categorical else Kind.NUMERIC
        else:
            text_columns.append(name)
    if text_columns:
        parser = rows_lib.RowParser(source, Columns(categorical=tuple(text_columns)))

        def count(file, line, text):
            parsed = parser.parse(file, line, text)
            usable = ~parsed.blank & ~parsed.malformed
            out = {}
            for name in text_columns:
                number, missing = rows_lib.is_number(parsed.categorical[name])
                out[name] = tf.stack(
                    [
                        tf.reduce_sum(tf.cast(number & usable, tf.int64)),
                        tf.reduce_sum(tf.cast(~number & ~missing & usable, tf.int64)),
                    ]
                )
            return out

        totals = {name: np.zeros(2, np.int64) for name in text_columns}
        for block in _blocks(
            source, count, take_rows=SAMPLE_ROWS, files=list(range(min(len(source.files), 4)))
        ):
            for name in text_columns:
                totals[name] += block[name]
        for name in text_columns:
            numbers, not_numbers = totals[name]
            kinds[name] = schema_lib.infer_kind(
                name, choices, numbers=int(numbers), not_numbers=int(not_numbers)
            )
    return {name: kinds[name] for name in features}


# The most frequent values of a date column its statistics are computed from.
DATE_VALUES = 100_000


def _date_columns(counters: dict, choices: ColumnChoices) -> dict[str, schema_lib.DateColumn]:
    """The text columns that are dates: declared (`choices.dates`), or found so (ISO dates, in
    a column no flag names categorical), from the values the scan counted."""
    declared = dict(choices.dates)
    found = {}
    for name, counter in counters.items():

        def values(n: int, counter=counter) -> list[tuple[str, int]]:
            return [(v.decode("utf-8", "replace"), c) for v, c in counter.most_common(n)]

        if name in declared:
            fmt = declared[name]
        elif name not in choices.categorical and schema_lib.detected_dates(values(200)):
            fmt = "iso"
        else:
            continue
        found[name] = schema_lib.date_column(
            name, values(DATE_VALUES), fmt=fmt, missing=0, declared=name in declared
        )
        logging.info("Column '%s' holds %s dates: read as dates.", name, fmt)
    return found


def scan_training(
    source: Source,
    choices: ColumnChoices,
    *,
    bad_rows: BadRows,
    holdout: Holdout | None,
    seed: int = 0,
) -> Schema:
    """The schema of the training data, from one streaming pass over it."""
    schema_lib.check_choices(source.columns, choices, source=source.pattern)
    source.format.check_whole(source)
    kinds = _sample_kinds(source, choices)
    numeric = tuple(n for n, k in kinds.items() if k is Kind.NUMERIC)
    categorical = tuple(n for n, k in kinds.items() if k is Kind.CATEGORICAL)
    tally = _Tally.empty(source, choices, numeric, categorical, seed=seed)
    notes = blocks_lib.Notes()
    scan = _block_scanner(source, choices, numeric, categorical, holdout)
    for block in _blocks(source, scan, notes=notes):
        tally.update(block)
    _check_whole(source, bad_rows, notes)
    tally.log.check(bad_rows, choices.label, weight=choices.weight)
    if not tally.rows.sum():
        raise InputError(f"{source.flag}: {', '.join(source.files[:5])} holds no data rows.")
    weight = None
    if choices.weight:
        _check_weights(source, choices.weight, tally.weights[0], "training rows")
        if holdout:
            _check_weights(source, choices.weight, tally.weights[1], "held-out rows")
        weight = schema_lib.Weight(choices.weight, float(tally.weights.sum() / tally.rows.sum()))
    label = tally.label
    label_schema = schema_lib.infer_label(
        choices.label,
        choices.head,
        distinct=None
        if label.overflowed
        else {k.decode("utf-8", "replace"): v for k, v in label.distinct.items()},
        all_numbers=label.all_numbers,
        all_integral=label.non_integral == 0,
        mean=label.moments.mean if label.moments.count else float("nan"),
        std=label.moments.std,
    )
    date_columns = _date_columns(tally.counters, choices)
    warnings = _column_warnings(tally.counters, date_columns)
    for warning in warnings:
        logging.warning("%s", warning)
    summary = {
        "bad_rows": bad_rows.value,
        "warnings": warnings,
        "train": _source_summary(
            source, tally.rows, tally.log.per_file, notes, tally.held if holdout else None
        ),
        "holdout": dataclasses.asdict(holdout) if holdout else None,
        "statistics": {
            "quantile_sample": stats.QUANTILE_SAMPLE,
            "sampled_quantiles": [
                n for n in numeric if tally.moments[n].count > stats.QUANTILE_SAMPLE
            ],
            "approximate_counts": [n for n in categorical if not tally.counters[n].is_exact],
            "kinds_from_first_rows": SAMPLE_ROWS,
        },
    }
    columns = tuple(tally.column(name, choices, date_columns) for name in kinds)
    return Schema(columns, label_schema, summary, weight)


def _block_scanner(
    source: Source,
    choices: ColumnChoices,
    numeric: tuple[str, ...],
    categorical: tuple[str, ...],
    holdout: Holdout | None,
) -> Callable:
    """What the pass computes on a block of lines, in TensorFlow: the bad rows, and of the
    good ones their files, whether held out, the numbers, each categorical column's distinct
    values and counts (then the label's), the label as a number, the weights."""
    parser = rows_lib.RowParser(
        source, Columns(numeric, categorical, choices.label, choices.weight)
    )
    forced_regression = choices.head is HeadType.REGRESSION

    def scan(file, line, text):
        parsed = parser.parse(file, line, text)
        reasons = rows_lib.feature_reasons(parsed) | rows_lib.label_reasons(
            parsed, regression=forced_regression
        )
        if choices.weight:
            reasons |= rows_lib.weight_reasons(parsed)
        out = first_bad(parsed, reasons)
        usable = ~parsed.blank & tf.equal(reasons, 0)
        good = parsed.take(usable)
        out["files"] = good.file
        out["held_out"] = (
            holdout.held_out(*source.origin(good.file, good.line))
            if holdout
            else tf.zeros(tf.shape(good.file), tf.bool)
        )
        out["numeric"] = (
            tf.stack([good.numeric[n] for n in numeric], axis=1)
            if numeric
            else tf.zeros([tf.size(good.file), 0])
        )
        # Each categorical column's distinct values and counts, one after another.
        values, counts, sizes = [], [], []
        for name in categorical + ("",):
            column = good.categorical[name] if name else good.label_text
            distinct, _, count = tf.unique_with_counts(column)
            values.append(distinct)
            counts.append(tf.cast(count, tf.int64))
            sizes.append(tf.size(distinct, tf.int64))
        out["values"], out["counts"] = tf.concat(values, 0), tf.concat(counts, 0)
        out["sizes"] = tf.stack(sizes)
        out["label_numbers"] = good.label_value
        out["label_is_number"] = good.label_is_number
        if choices.weight:
            out["weights"] = good.weight
        return out

    return scan


@dataclasses.dataclass
class _Tally:
    """What the pass has counted so far: rows per file (held out among them), each numeric
    column's moments, missing values and quantile sample, each categorical column's counts,
    the label's values, the weight sums (trained on, held out) and the bad rows."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    rows: np.ndarray
    held: np.ndarray
    moments: dict[str, stats.Moments]
    missing: dict[str, int]
    samples: dict[str, stats.QuantileSample]
    counters: dict[str, stats.Counter]
    label: stats.LabelValues
    weights: np.ndarray
    log: BadRowLog

    @classmethod
    def empty(
        cls,
        source: Source,
        choices: ColumnChoices,
        numeric: tuple[str, ...],
        categorical: tuple[str, ...],
        *,
        seed: int,
    ) -> _Tally:
        capacity = max(2 * choices.max_vocabulary_size, 1000)
        return cls(
            numeric,
            categorical,
            rows=np.zeros(len(source.files), np.int64),
            held=np.zeros(len(source.files), np.int64),
            moments={n: stats.Moments() for n in numeric},
            missing={n: 0 for n in numeric},
            samples={n: stats.QuantileSample(seed=seed + i) for i, n in enumerate(numeric)},
            counters={n: stats.Counter(capacity) for n in categorical},
            label=stats.LabelValues(schema_lib.MAX_CLASSES),
            weights=np.zeros(2),
            log=BadRowLog(source, numeric),
        )

    def update(self, block: dict) -> None:
        self.log.update(block)
        if "weights" in block:
            w = block["weights"].astype(np.float64)
            self.weights += (w[~block["held_out"]].sum(), w[block["held_out"]].sum())
        self.rows += np.bincount(block["files"], minlength=len(self.rows))
        self.held += np.bincount(block["files"][block["held_out"]], minlength=len(self.rows))
        for i, name in enumerate(self.numeric):
            values = block["numeric"][:, i]
            self.missing[name] += int(np.isnan(values).sum())
            self.moments[name].update(values)
            self.samples[name].update(values)
        ends = np.cumsum(block["sizes"])
        for name, start, end in zip(self.categorical, ends - block["sizes"], ends):
            self.counters[name].update(block["values"][start:end], block["counts"][start:end])
        label_start = ends[-2] if len(ends) > 1 else 0
        self.label.update(
            block["values"][label_start:],
            block["counts"][label_start:],
            block["label_numbers"],
            block["label_is_number"],
        )

    def column(
        self, name: str, choices: ColumnChoices, date_columns: dict[str, schema_lib.DateColumn]
    ) -> schema_lib.Column:
        """The schema's column `name`, from what was counted."""
        if name in self.moments:
            m = self.moments[name]
            return schema_lib.numeric_column(
                name,
                count=m.count,
                missing=self.missing[name],
                mean=m.mean,
                std=m.std,
                minimum=m.min,
                maximum=m.max,
                sample=self.samples[name].values,
                num_bins=choices.num_bins,
                missing_indicator=choices.missing_indicators,
            )
        if name in date_columns:
            return date_columns[name]
        counter = self.counters[name]
        return schema_lib.categorical_column(
            name,
            [
                (v.decode("utf-8", "replace"), c)
                for v, c in counter.most_common(choices.max_vocabulary_size)
            ],
            count_error=counter.max_count_error,
            choices=choices,
        )


def _column_warnings(
    counters: dict[str, stats.Counter], date_columns: dict[str, schema_lib.DateColumn]
) -> list[str]:
    """What looks wrong in the categorical columns (an id, a number read as text, ...)."""
    return [
        warning
        for name, counter in counters.items()
        if name not in date_columns
        for warning in schema_lib.column_warnings(
            name,
            [v.decode("utf-8", "replace") for v, _ in counter.most_common(200)],
            distinct=len(counter.counts) - (b"" in counter.counts),
            rows=counter.rows - counter.counts.get(b"", 0),
            exact=counter.is_exact,
        )
    ]


def _check_weights(source: Source, name: str, total: float, rows: str) -> None:
    if not total > 0:
        raise InputError(
            f"{source.flag}: weight column '{name}' is 0 in all the {rows} of "
            f"{source.pattern}: nothing would be trained or measured. Check --weight_column."
        )


def scan_eval(source: Source, schema: Schema, *, bad_rows: BadRows) -> dict:
    """Checks the eval data against the schema in one pass; returns its summary (rows and bad
    rows per file)."""
    label = schema.label
    weight = schema.weight.name if schema.weight else None
    source.require(
        (*schema.feature_names, label.name, *([weight] if weight else [])),
        what="the training data has them",
    )
    parser = rows_lib.RowParser(
        source, Columns(schema.numeric_names, schema.categorical_names, label.name, weight)
    )
    classes = tf.constant(label.classes or ("",))
    source.format.check_whole(source)

    def check(file, line, text):
        parsed = parser.parse(file, line, text)
        reasons = rows_lib.feature_reasons(parsed) | rows_lib.label_reasons(
            parsed, regression=label.is_regression
        )
        if weight:
            reasons |= rows_lib.weight_reasons(parsed)
        if not label.is_regression:
            assert parsed.label_text is not None, "the training rows have the label"
            known = tf.reduce_any(tf.equal(parsed.label_text[:, None], classes[None, :]), 1)
            reasons |= tf.where(known | (reasons != 0), 0, rows_lib.LABEL_UNKNOWN)
        out = first_bad(parsed, reasons)
        usable = ~parsed.blank & tf.equal(reasons, 0)
        out["files"] = tf.boolean_mask(parsed.file, usable)
        if weight:
            out["weights"] = tf.boolean_mask(parsed.weight, usable)
        return out

    rows = np.zeros(len(source.files), np.int64)
    total_weight = 0.0
    log = BadRowLog(source, schema.numeric_names)
    notes = blocks_lib.Notes()
    for block in _blocks(source, check, notes=notes):
        log.update(block)
        rows += np.bincount(block["files"], minlength=len(rows))
        if weight:
            total_weight += float(block["weights"].astype(np.float64).sum())
    _check_whole(source, bad_rows, notes)
    log.check(bad_rows, label.name, label.classes, weight)
    if not rows.sum():
        raise InputError(f"{source.flag}: {', '.join(source.files[:5])} holds no data rows.")
    if weight:
        _check_weights(source, weight, total_weight, "rows")
    return _source_summary(source, rows, log.per_file, notes, None)


def _source_summary(
    source: Source,
    rows: np.ndarray,
    bad: np.ndarray,
    notes: blocks_lib.Notes,
    held: np.ndarray | None,
) -> dict:
    """Rows (usable), bad rows and held-out rows per file, and their totals; a file cut short
    says after which line its tail was lost, a file read in Python by lines (CSV, JSON Lines)
    the CRC-32 of its bytes (`notes`)."""
    files = [
        {"path": p, "rows": int(r), "bad_rows": int(b)} for p, r, b in zip(source.files, rows, bad)
    ]
    for path, entry in zip(source.files, files):
        if tail := notes.lost.get(path):
            entry["lost_tail_after_line"] = tail.lines
        if (crc := notes.checksums.get(path)) is not None:
            entry["crc32"] = crc
    if held is not None:
        for entry, h in zip(files, held):
            entry["holdout_rows"] = int(h)
    summary = {
        "pattern": source.pattern,
        "format": source.format.name,
        "rows": int(rows.sum()),
        "bad_rows": int(bad.sum()),
        "files": files,
    }
    if notes.lost:
        summary["lost_tails"] = len(notes.lost)
    if held is not None:
        summary["holdout_rows"] = int(held.sum())
    return summary
