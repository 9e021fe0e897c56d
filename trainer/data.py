"""Reading tabular input once: CSV (with a header) or TFRecord files of tf.Example, local or
any filesystem `tf.io.gfile` knows, into an in-memory table of raw string columns.

The table is encoded once (by the same preprocessing layer the exported model carries) and
fed to every iteration from memory, so input is never re-read per iteration.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os

import numpy as np
import tensorflow as tf

from trainer import schema as schema_lib
from trainer.errors import InputError

_PACKAGE_DATA = os.path.join(os.path.dirname(__file__), "data")
CENSUS_TRAIN = os.path.join(_PACKAGE_DATA, "census", "train.csv.gz")
CENSUS_TEST = os.path.join(_PACKAGE_DATA, "census", "test.csv.gz")
CENSUS_LABEL = "income_bracket"

_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz", ".tfr")


@dataclasses.dataclass(frozen=True)
class RawTable:
    """Columns of raw values as numpy string arrays, and where each row came from."""

    columns: dict[str, np.ndarray]
    where: schema_lib.Locator

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values())))


def expand(pattern_list: str, *, flag: str) -> list[str]:
    """Expands a comma-separated list of files or globs; fails if any matches nothing."""
    files: list[str] = []
    for pattern in [p.strip() for p in pattern_list.split(",") if p.strip()]:
        try:
            matches = sorted(tf.io.gfile.glob(pattern))
        except tf.errors.OpError as e:
            raise InputError(f"{flag}: cannot list '{pattern}': {e.message}") from None
        matches = [m for m in matches if not tf.io.gfile.isdir(m)]
        if not matches:
            raise InputError(f"{flag}: '{pattern}' matches no file. Check the path.")
        files.extend(matches)
    if not files:
        raise InputError(f"{flag} is empty: give a file, a glob or a comma-separated list.")
    return files


def read(pattern_list: str, *, flag: str) -> RawTable:
    """Reads every file of `pattern_list` into one RawTable (all files share one header)."""
    files = expand(pattern_list, flag=flag)
    tfrecord = [f.endswith(_TFRECORD_SUFFIXES) for f in files]
    if any(tfrecord) and not all(tfrecord):
        raise InputError(f"{flag} mixes TFRecord and CSV files: {files}. Use one format.")
    reader = _read_tfrecord if tfrecord[0] else _read_csv
    header: list[str] | None = None
    parts, lines, starts = [], [], []
    total = 0
    for path in files:
        file_header, rows, row_lines = reader(path, flag=flag)
        if header is None:
            header = file_header
        elif file_header != header:
            raise InputError(f"{flag}: {path} has columns {file_header}, but {files[0]} has "
                             f"{header}. All files of one input need the same columns.")
        starts.append(total)
        total += len(rows)
        parts.append(rows)
        lines.append(row_lines)
    if total == 0:
        raise InputError(f"{flag}: {', '.join(files)} holds no data rows.")
    table = np.concatenate([p for p in parts if len(p)], axis=0)
    columns = {name: table[:, i] for i, name in enumerate(header)}
    unit = "record" if tfrecord[0] else "line"
    return RawTable(columns, schema_lib.Locator(files, starts, np.concatenate(lines), unit))


def _open_text(path: str, *, flag: str) -> io.TextIOBase:
    """The whole file as text (the table is held in memory anyway); .gz is decompressed."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            raw = f.read()
    except tf.errors.OpError as e:
        raise InputError(f"{flag}: cannot read {path}: {e.message}") from None
    stream = io.BytesIO(raw)
    if path.endswith(".gz"):
        stream = gzip.GzipFile(fileobj=stream)
    # utf-8-sig: spreadsheet exports start with a byte-order mark that is not part of the
    # first column name.
    return io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")


def _read_csv(path: str, *, flag: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    try:
        with _open_text(path, flag=flag) as f:
            reader = csv.reader(f, skipinitialspace=True)
            header = next(reader, None)
            if not header:
                raise InputError(f"{flag}: {path} is empty; a CSV file needs a header row and "
                                 "data rows.")
            header = [h.strip() for h in header]
            if len(set(header)) != len(header) or "" in header:
                raise InputError(f"{flag}: the header of {path} has empty or repeated column "
                                 f"names: {header}.")
            rows, lines = [], []
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise InputError(
                        f"{flag}: {path} line {reader.line_num} has {len(row)} fields, the "
                        f"header has {len(header)}. Fix that line (quote values with commas).")
                rows.append(row)
                lines.append(reader.line_num)
    except (UnicodeDecodeError, OSError, EOFError, csv.Error) as e:
        raise InputError(f"{flag}: cannot read {path} as CSV text ({e}). Is it a CSV file "
                         "(optionally .gz), or a TFRecord file named *.tfrecord?") from None
    table = np.array(rows, dtype=str).reshape(len(rows), len(header))
    return header, table, np.array(lines, dtype=np.int64)


def _read_tfrecord(path: str, *, flag: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    compression = "GZIP" if path.endswith(".gz") else ""
    records: list[dict[str, str]] = []
    try:
        for record in tf.data.TFRecordDataset(path, compression_type=compression):
            example = tf.train.Example.FromString(record.numpy())
            records.append({k: _feature_text(v) for k, v in example.features.feature.items()})
    except InputError:
        raise
    except Exception as e:  # a corrupt file raises OpError, a corrupt record DecodeError
        raise InputError(f"{flag}: cannot read {path} as TFRecord files of tf.Example "
                         f"({type(e).__name__}: {e}).") from None
    header = sorted({k for r in records for k in r})
    rows = np.array([[r.get(k, "") for k in header] for r in records], dtype=str)
    return header, rows.reshape(len(records), len(header)), np.arange(1, len(records) + 1)


def _feature_text(feature: tf.train.Feature) -> str:
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    if len(values) > 1:
        raise InputError(f"a tf.Example feature holds {len(values)} values; this trainer takes "
                         "one value per feature.")
    if not values:
        return ""
    value = values[0]
    return value.decode("utf-8") if isinstance(value, bytes) else repr(value)


def schema_from(table: RawTable, choices: schema_lib.ColumnChoices, *,
                source: str) -> schema_lib.Schema:
    """Infers the schema from the training table."""
    schema_lib.check_choices(list(table.columns), choices, source=source)
    label = schema_lib.infer_label(choices.label, table.columns[choices.label], choices.head,
                                   table.where)
    return schema_lib.Schema(schema_lib.infer_columns(table.columns, choices, table.where),
                             label)


@dataclasses.dataclass(frozen=True)
class Examples:
    """Raw feature columns (numeric ones parsed to float32) and encoded labels."""

    features: dict[str, np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: np.ndarray) -> "Examples":
        return Examples({k: v[rows] for k, v in self.features.items()}, self.labels[rows])


def examples_from(table: RawTable, schema: schema_lib.Schema, *, flag: str) -> Examples:
    """Checks a table against the schema and returns typed columns and encoded labels."""
    missing = [n for n in (*schema.feature_names, schema.label.name) if n not in table.columns]
    if missing:
        raise InputError(f"{flag}: column(s) {missing} are missing; the training data has them. "
                         f"Columns found: {', '.join(table.columns)}.")
    features = {}
    for column in schema.columns:
        values = table.columns[column.name]
        if column.kind is schema_lib.Kind.NUMERIC:
            numbers, bad = schema_lib.parse_numbers(values)
            if bad.any():
                row = int(np.argmax(bad))
                raise InputError(f"{flag}: numeric column '{column.name}' holds "
                                 f"{values[row]!r} at {table.where(row)}. Fix the value.")
            features[column.name] = numbers.astype(np.float32)
        else:
            features[column.name] = np.char.strip(values.astype(str)).astype(object)
    return Examples(features, encode_labels(table, schema.label, flag=flag))


def encode_labels(table: RawTable, label: schema_lib.Label, *, flag: str) -> np.ndarray:
    """Regression targets as float32, or class ids (int64) into `label.classes`."""
    values = table.columns[label.name]
    try:
        if label.head is schema_lib.HeadType.REGRESSION:
            return schema_lib.regression_targets(label.name, values, table.where).astype(
                np.float32)
        schema_lib.check_labels_present(label.name, values, table.where)
    except InputError as e:
        raise InputError(f"{flag}: {e}") from None
    names = schema_lib.class_names(values)
    index = {c: i for i, c in enumerate(label.classes)}
    ids = np.array([index.get(n, -1) for n in names], dtype=np.int64)
    if (ids < 0).any():
        row = int(np.argmax(ids < 0))
        raise InputError(f"{flag}: label {values[row]!r} at {table.where(row)} is not one of "
                         f"the training labels {list(label.classes)}.")
    return ids


def split_holdout(examples: Examples, fraction: float, seed: int) -> tuple[Examples, Examples]:
    """Splits off a seeded random `fraction` of rows for evaluation."""
    order = np.random.default_rng(seed).permutation(len(examples))
    n_eval = max(1, int(round(len(examples) * fraction)))
    return examples.take(np.sort(order[n_eval:])), examples.take(np.sort(order[:n_eval]))
