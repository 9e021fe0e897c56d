"""Rows in TensorFlow: a block of rows (`trainer/input/blocks.py`) parsed, whole, into typed
columns and the reasons a row cannot be used. No Python runs per row.

A CSV line must have exactly as many fields as the header; quoted fields may hold commas and
doubled quotes (`"Smith, J"`, `"say ""hi"" "`) and must start right after the comma. A field
spanning lines is not supported: its line is reported as malformed. Formats converted in
Python (JSON Lines, BigQuery, Parquet) come as CSV lines (`trainer/input/formats/base.py`); a
nested value in a column used is malformed.
"""

from __future__ import annotations

import dataclasses
import re

import tensorflow as tf

from trainer.input import schema as schema_lib
from trainer.input.formats.base import BYTES, FLOAT, INT64, NESTED, RowText, Source

# Why a row cannot be used: bits of one int32 per row, 0 for a good row.
MALFORMED = 1  # CSV: wrong field count or quoting; TFRecord: a feature with several values
NOT_A_NUMBER = 2  # a numeric feature holds text
LABEL_MISSING = 4
LABEL_NOT_FINITE = 8  # nan or inf
LABEL_NOT_A_NUMBER = 16  # a regression label holds text
LABEL_UNKNOWN = 32  # a class the training data does not have
WEIGHT_INVALID = 64  # the example weight is missing, not a number, negative or not finite

# What `float()` reads, but no digit-group underscores; "nan", "inf" and "infinity" included
# (a numeric feature treats them as missing; a label with them is an error).
_NUMBER = r"(?i)[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|[+-]?(?:nan|inf|infinity)"
_FIELD = r'(?:[^,"\r\n]*|"(?:[^"]|"")*")'
# A numeric field `decode_csv` parses exactly as `float()` does: a plain number, or empty.
_PLAIN_NUMBER_FIELD = r" *(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)? *"


_MISSING = "|".join(re.escape(token) for token in sorted(schema_lib.MISSING_TOKENS))

# RE2 compiles a row's regular expression (one group per field) to a DFA whose memory grows
# with the fields: past about 700 it runs out, falls back to a matcher ~30x slower and logs a
# line per block. Rows wider than this are checked field by field instead (split at the commas
# outside quotes): linear in the fields, but about 6x slower per field than the row's DFA.
_ROW_REGEX_FIELDS = 256
_QUOTED = r'"(?:[^"]|"")*"'
_QUOTED_MARK = "\x00"  # a quoted field, once replaced (a field that holds a NUL is malformed)


# -- parsing --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Columns:
    """What to parse from each row: numeric and categorical features, the label and the
    example weight."""

    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    label: str | None = None
    weight: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (
            self.numeric
            + self.categorical
            + ((self.label,) if self.label else ())
            + ((self.weight,) if self.weight else ())
        )


@dataclasses.dataclass
class Parsed:
    """A parsed block. `numeric` values are NaN where missing or unparsable; `categorical`
    values are stripped text ("" where missing). The label comes as canonical text (numbers
    written without a fraction when integral, so that labels 1 and 1.0 are one class) and as
    a number (NaN where it is not one). The weight is a number, NaN where it is not one."""

    file: tf.Tensor
    line: tf.Tensor
    text: tf.Tensor
    blank: tf.Tensor
    malformed: tf.Tensor
    numeric: dict[str, tf.Tensor]
    not_a_number: dict[str, tf.Tensor]
    categorical: dict[str, tf.Tensor]
    label_text: tf.Tensor | None = None
    label_value: tf.Tensor | None = None
    label_missing: tf.Tensor | None = None
    label_is_number: tf.Tensor | None = None
    weight: tf.Tensor | None = None

    def features(self) -> dict[str, tf.Tensor]:
        """The raw feature columns as the model's serving signature takes them."""
        return {**self.numeric, **self.categorical}

    def take(self, mask: tf.Tensor) -> Parsed:
        """The rows where `mask` holds: one index for every column (a `tf.boolean_mask` of
        each computed it again, and took 20 ms each to trace)."""
        index = tf.reshape(tf.where(mask), [-1])

        def pick(value):
            if value is None:
                return None
            if isinstance(value, dict):
                return {k: tf.gather(v, index) for k, v in value.items()}
            return tf.gather(value, index)

        return Parsed(**{f.name: pick(getattr(self, f.name)) for f in dataclasses.fields(self)})


class RowParser:
    """Parses blocks of one source into the given columns."""

    def __init__(self, source: Source, columns: Columns):
        self.source = source
        self.columns = columns
        source.require(columns.names, what="the model needs them")

    def parse(self, file: tf.Tensor, line: tf.Tensor, text: tf.Tensor) -> Parsed:
        if self.source.format.row_text is RowText.EXAMPLE:
            return self._parse_examples(file, line, text)
        return self._parse_csv(file, line, text)

    # -- CSV ------------------------------------------------------------------------------
    def _parse_csv(self, file, line, text) -> Parsed:
        """Most rows hold plain numbers in their numeric fields: those rows (`fast`, one
        regular expression per line) are decoded with the numbers parsed by `decode_csv`
        itself. The rest (missing tokens, typos, malformed lines) are parsed field by field
        as text, and their results put back in place."""
        source, columns = self.source, self.columns
        width = len(source.columns)
        wanted = sorted({source.columns.index(n) for n in columns.names})
        numeric_at = {source.columns.index(n) for n in columns.numeric}
        filler = "," * (width - 1)  # decode_csv fails the whole block on one bad line
        blank = tf.equal(tf.strings.length(tf.strings.strip(text)), 0)
        fast = _plain_rows(text, width, numeric_at) & ~blank
        fields = tf.io.decode_csv(
            tf.where(fast, text, filler),
            [[float("nan")] if i in numeric_at else [""] for i in wanted],
            select_cols=wanted,
        )
        fast_fields = dict(zip((source.columns[i] for i in wanted), fields))

        where = tf.where(~fast & ~blank)  # [k, 1]: the rows parsed as text
        slow = tf.gather_nd(text, where)
        well_formed = _well_formed_rows(slow, width)
        slow_fields = dict(
            zip(
                (source.columns[i] for i in wanted),
                tf.io.decode_csv(
                    tf.where(well_formed, slow, filler), [[""]] * len(wanted), select_cols=wanted
                ),
            )
        )
        size = tf.shape(text, out_type=tf.int64)

        def put_back(fast_values, slow_values):
            return tf.tensor_scatter_nd_update(fast_values, where, slow_values)

        numbers, not_a_number = {}, {}
        for name in columns.numeric:
            value, is_number, is_missing = _parse_numbers(
                tf.strings.strip(slow_fields[name]), _MISSING
            )
            numbers[name] = put_back(tf.cast(fast_fields[name], tf.float64), value)
            not_a_number[name] = tf.scatter_nd(where, ~is_number & ~is_missing & well_formed, size)
        texts = {
            name: put_back(tf.strings.strip(fast_fields[name]), tf.strings.strip(slow_fields[name]))
            for name in columns.categorical + tuple(n for n in (columns.label, columns.weight) if n)
        }
        malformed = tf.scatter_nd(where, ~well_formed, size)
        if source.format.nested_values:  # a nested value in a column used is malformed
            for name in columns.numeric:
                malformed |= tf.scatter_nd(where, _nested(slow_fields[name]), size)
            for value in texts.values():
                malformed |= _nested(value)
        return self._typed(file, line, text, blank, malformed, texts, numbers, not_a_number)

    # -- TFRecord -------------------------------------------------------------------------
    def _parse_examples(self, file, line, text) -> Parsed:
        dtypes = {BYTES: tf.string, INT64: tf.int64, FLOAT: tf.float32}
        spec = {
            n: tf.io.RaggedFeature(dtypes[self.source.feature_type(n) or BYTES])
            for n in self.columns.names
        }
        ragged = tf.io.parse_example(text, spec)
        malformed = tf.zeros(tf.shape(text), tf.bool)
        texts, numbers, not_a_number = {}, {}, {}
        for name, values in ragged.items():
            count = values.row_lengths()
            malformed |= count > 1
            present = count > 0
            if values.dtype == tf.string:
                texts[name] = tf.strings.strip(
                    values.to_tensor(default_value="", shape=[None, 1])[:, 0]
                )
                if name in self.columns.numeric:  # numbers written as text
                    numbers[name], is_number, is_missing = _parse_numbers(texts[name], _MISSING)
                    not_a_number[name] = ~is_number & ~is_missing
                continue
            value = tf.cast(values.to_tensor(shape=[None, 1])[:, 0], tf.float64)
            numbers[name] = tf.where(present, value, float("nan"))
            not_a_number[name] = tf.zeros(tf.shape(text), tf.bool)
            if name not in self.columns.numeric:  # a number used as a category or label
                texts[name] = tf.where(present, _number_text(numbers[name]), "")
        blank = tf.zeros(tf.shape(text), tf.bool)
        return self._typed(file, line, text, blank, malformed, texts, numbers, not_a_number)

    # -- typing ---------------------------------------------------------------------------
    def _typed(
        self, file, line, text, blank, malformed, texts: dict, numbers: dict, not_a_number: dict
    ) -> Parsed:
        """The parsed block: numeric features as float32 (non-finite values are missing),
        categorical ones as text, and the label both ways."""
        columns = self.columns
        numeric = {
            name: tf.cast(
                tf.where(tf.math.is_finite(numbers[name]), numbers[name], float("nan")), tf.float32
            )
            for name in columns.numeric
        }
        parsed = Parsed(
            file,
            line,
            text,
            blank,
            malformed,
            numeric,
            {name: not_a_number[name] & ~malformed for name in columns.numeric},
            {name: texts[name] for name in columns.categorical},
        )
        if columns.label:
            label_text = texts[columns.label]
            value, is_number, _ = _parse_numbers(label_text, "")
            # Formatting numbers costs more than the rest of a label's parse: only blocks
            # holding numeric labels pay for it.
            parsed.label_text = tf.cond(
                tf.reduce_any(is_number),
                lambda: tf.where(is_number & _is_integral(value), _number_text(value), label_text),
                lambda: label_text,
            )
            parsed.label_value = value
            parsed.label_is_number = is_number
            # The tokens that mean "missing" in a numeric feature mean a missing label too.
            parsed.label_missing = (
                tf.strings.regex_full_match(tf.strings.strip(label_text), _MISSING) & ~malformed
            )
        if columns.weight:
            # A TFRecord number comes as one; CSV text (and numbers written as text) is parsed.
            weight = numbers.get(columns.weight)
            if weight is None:
                weight = _parse_numbers(texts[columns.weight], "")[0]
            parsed.weight = tf.cast(weight, tf.float32)
        return parsed


def _nested(text: tf.Tensor) -> tf.Tensor:
    """Whether each field holds a nested value (`NESTED` and its text)."""
    return tf.equal(tf.strings.substr(tf.strings.strip(text), 0, 1), NESTED)


def is_number(text: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(whether each stripped text is a number, whether it is a missing-value token), as a
    numeric feature's values are told apart."""
    is_missing = tf.strings.regex_full_match(text, _MISSING)
    return tf.strings.regex_full_match(text, _NUMBER) & ~is_missing, is_missing


def _plain_rows(text: tf.Tensor, width: int, numeric_at: set[int]) -> tf.Tensor:
    """Which lines are `width` CSV fields with a plain number (or nothing) in each field of
    `numeric_at`: the lines `decode_csv` parses exactly as `float()` would."""
    if width <= _ROW_REGEX_FIELDS:
        pattern = (_PLAIN_NUMBER_FIELD if i in numeric_at else _FIELD for i in range(width))
        return tf.strings.regex_full_match(text, ",".join(pattern))
    fields, well_formed = _split_fields(text, width)
    if not numeric_at:
        return well_formed
    at = tf.constant(sorted(numeric_at), tf.int32)
    numbers = tf.gather(fields.to_tensor("", shape=[None, width]), at, axis=1)
    return well_formed & tf.reduce_all(
        tf.strings.regex_full_match(numbers, _PLAIN_NUMBER_FIELD), axis=1
    )


def _well_formed_rows(text: tf.Tensor, width: int) -> tf.Tensor:
    """Which lines are `width` CSV fields, each plain or wholly quoted."""
    if width <= _ROW_REGEX_FIELDS:
        return tf.strings.regex_full_match(text, ",".join([_FIELD] * width))
    return _split_fields(text, width)[1]


def _split_fields(text: tf.Tensor, width: int) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """(each line's fields, quoted ones replaced by a mark; whether the line is `width`
    fields, each plain or wholly quoted), without a regular expression per row."""
    fields = tf.strings.split(tf.strings.regex_replace(text, _QUOTED, _QUOTED_MARK), ",")
    each = tf.strings.regex_full_match(
        fields.flat_values, f'[^"\r\n{_QUOTED_MARK}]*|{_QUOTED_MARK}'
    )
    every = tf.reduce_all(fields.with_flat_values(each), axis=1)
    return fields, tf.equal(fields.row_lengths(), width) & every


def _parse_numbers(text: tf.Tensor, missing: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(float64 values, NaN unless a number; whether each is a number; whether each is a
    missing value: a full match of the pattern `missing`)."""
    is_missing = tf.strings.regex_full_match(text, missing)
    is_number = tf.strings.regex_full_match(text, _NUMBER) & ~is_missing
    value = tf.strings.to_number(tf.where(is_number, text, "nan"), tf.float64)
    return value, is_number, is_missing


def _is_integral(value: tf.Tensor) -> tf.Tensor:
    return tf.math.is_finite(value) & tf.equal(value, tf.round(value)) & (tf.abs(value) < 2**53)


def _number_text(value: tf.Tensor) -> tf.Tensor:
    """Integral numbers without a fraction ("1", not "1.0"); others in their shortest form."""
    return tf.where(
        _is_integral(value),
        tf.strings.as_string(tf.cast(tf.where(_is_integral(value), value, 0.0), tf.int64)),
        tf.strings.as_string(value, shortest=True),
    )


# -- why rows cannot be used ----------------------------------------------------------------
def feature_reasons(parsed: Parsed) -> tf.Tensor:
    """Reason bits that depend on the features alone (`MALFORMED`, `NOT_A_NUMBER`)."""
    reasons = tf.where(parsed.malformed, MALFORMED, 0)
    for bad in parsed.not_a_number.values():
        reasons |= tf.where(bad, NOT_A_NUMBER, 0)
    return reasons


def label_reasons(parsed: Parsed, *, regression: bool) -> tf.Tensor:
    """Reason bits of the label: missing, not finite, or (`regression`) not a number."""
    assert parsed.label_missing is not None and parsed.label_is_number is not None, "no label"
    reasons = tf.where(parsed.label_missing, LABEL_MISSING, 0)
    reasons |= tf.where(
        parsed.label_is_number & ~tf.math.is_finite(parsed.label_value), LABEL_NOT_FINITE, 0
    )
    if regression:
        reasons |= tf.where(~parsed.label_is_number & ~parsed.label_missing, LABEL_NOT_A_NUMBER, 0)
    return tf.where(parsed.malformed, 0, reasons)


def weight_reasons(parsed: Parsed) -> tf.Tensor:
    """`WEIGHT_INVALID` where the weight is not a finite number >= 0 (a missing weight
    included: a row without one cannot be weighted)."""
    assert parsed.weight is not None, "no weight"
    valid = tf.math.is_finite(parsed.weight) & (parsed.weight >= 0)
    return tf.where(valid | parsed.malformed, 0, WEIGHT_INVALID)


def first_where(mask: tf.Tensor, *values: tf.Tensor) -> list[tf.Tensor]:
    """Each of `values` at the first row where `mask` holds (at row 0 if none does; a zero
    of its type if there are no rows)."""
    first = tf.argmax(tf.concat([tf.cast(mask, tf.int32), [1]], 0), output_type=tf.int32)
    first = tf.minimum(first, tf.maximum(tf.size(mask) - 1, 0))
    return [tf.gather(tf.concat([v, tf.zeros([1], v.dtype)], 0), first) for v in values]


def first_numeric_failure(parsed: Parsed) -> tf.Tensor:
    """Per row, the index into `parsed.not_a_number` of the first column that is not a number
    (-1 if none)."""
    if not parsed.not_a_number:
        return tf.fill(tf.shape(parsed.line), -1)
    bad = tf.stack(list(parsed.not_a_number.values()), axis=1)
    return tf.where(
        tf.reduce_any(bad, axis=1),
        tf.argmax(tf.cast(bad, tf.int32), axis=1, output_type=tf.int32),
        -1,
    )
