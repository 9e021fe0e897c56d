"""Rows that cannot be used: the first one of a pass described for the user (its file, line,
text and what to do), and the count per file. `--bad_rows=error` stops on the first one;
`--bad_rows=skip` skips them and reports how many."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.input import rows as rows_lib
from trainer.input.formats.base import Source
from trainer.input.options import BadRows


@dataclasses.dataclass(frozen=True)
class BadRow:
    """The first row of a pass that cannot be used, and why."""

    path: str
    line: int
    reasons: int
    text: bytes
    column: str | None  # the first numeric column that is not a number


# A value in an error line is cut to this many characters (a field of a whole file without its
# line ends would otherwise fill the screen).
SHOWN_CHARS = 80


def describe(
    bad: BadRow,
    source: Source,
    label: str | None,
    classes: tuple[str, ...] = (),
    weight: str | None = None,
) -> str:
    """What is wrong with a bad row, where, and how to fix it."""
    fmt = source.format
    where = f"{bad.path} {fmt.unit} {bad.line}"
    skip = " (or pass --bad_rows=skip to skip such rows)"
    value = lambda column: fmt.value(bad.text, source.columns, column)  # noqa: E731
    if bad.reasons & rows_lib.MALFORMED:
        return f"{source.flag}: {where} {fmt.describe_malformed(bad.text, source.columns)}{skip}."
    if bad.reasons & rows_lib.NOT_A_NUMBER:
        return (
            f"{source.flag}: numeric column '{bad.column}' holds {_shown(value(bad.column))} at "
            f"{where}. Fix the value, or pass --categorical_columns={bad.column} to treat "
            f"the column as categories{skip}."
        )
    if bad.reasons & rows_lib.LABEL_MISSING:
        token = value(label)
        what = (
            f"holds {_shown(token)} at {where}, a missing value"
            if token
            else f"is empty at {where}"
        )
        return (
            f"{source.flag}: label column '{label}' {what}: every row needs a label. Remove "
            f"or fix that row{skip}."
        )
    if bad.reasons & (rows_lib.LABEL_NOT_FINITE | rows_lib.LABEL_NOT_A_NUMBER):
        return (
            f"{source.flag}: label column '{label}' holds {_shown(value(label))} at {where}: "
            "regression labels must be finite numbers. Remove or fix that row, or choose "
            f"--head=binary or --head=multiclass{skip}."
        )
    if bad.reasons & rows_lib.WEIGHT_INVALID:
        return (
            f"{source.flag}: weight column '{weight}' holds {_shown(value(weight))} at {where}: "
            "weights must be finite numbers >= 0 (0 leaves a row out of the loss and the "
            f"metrics). Fix that row{skip}."
        )
    return (
        f"{source.flag}: label {_shown(value(label))} at {where} is not one of the training "
        f"labels {list(classes)[:20]}{skip}."
    )


def first_bad(parsed: rows_lib.Parsed, reasons: tf.Tensor) -> dict[str, tf.Tensor]:
    """The first bad row of a block (if any), and the file index of every bad row."""
    bad = reasons != 0
    file, line, reason, column, text = rows_lib.first_where(
        bad,
        parsed.file,
        parsed.line,
        tf.cast(reasons, tf.int64),
        tf.cast(rows_lib.first_numeric_failure(parsed), tf.int64),
        parsed.text,
    )
    return {
        "bad_files": tf.boolean_mask(parsed.file, bad),
        # count, file, line, reasons, index of the numeric column that failed
        "first_bad": tf.stack([tf.reduce_sum(tf.cast(bad, tf.int64)), file, line, reason, column]),
        "first_bad_text": text,
    }


class BadRowLog:
    """Bad rows per file, and the first one met."""

    def __init__(self, source: Source, numeric: tuple[str, ...]):
        self.source = source
        self.numeric = numeric
        self.per_file = np.zeros(len(source.files), np.int64)
        self.first: BadRow | None = None

    def update(self, block: dict[str, np.ndarray]) -> None:
        count, file, line, reasons, column = (int(v) for v in block["first_bad"])
        if not count:
            return
        self.per_file += np.bincount(block["bad_files"], minlength=len(self.per_file))
        row = BadRow(
            self.source.files[file],
            line,
            reasons,
            bytes(block["first_bad_text"]),
            self.numeric[column] if column >= 0 else None,
        )
        key = lambda r: (self.source.files.index(r.path), r.line)  # noqa: E731
        if self.first is None or key(row) < key(self.first):
            self.first = row

    def check(
        self,
        policy: BadRows,
        label: str | None,
        classes: tuple[str, ...] = (),
        weight: str | None = None,
    ) -> None:
        """Stops on a bad row (ERROR), or warns how many were skipped (SKIP)."""
        if self.first is None:
            return
        message = describe(self.first, self.source, label, classes, weight)
        if policy is BadRows.ERROR:
            raise InputError(message)
        logging.warning(
            "%s: skipped %d bad rows (first: %s)",
            self.source.flag,
            int(self.per_file.sum()),
            message,
        )


def _shown(value: str) -> str:
    """`value` as an error line shows it: its repr, cut to `SHOWN_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 4] + "...'"
