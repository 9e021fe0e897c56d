"""The instances a batch prediction reads, checked against the model's inputs and keyed
(`--key_field`, `--included_fields`, `--excluded_fields`: `instance_config.py`). CSV rows go
through the trainer's input pipeline and their JSON lines are formatted by TensorFlow string ops
(`csv_batches`): no Python per good row. JSON Lines, and CSV rows that need Python, are parsed a
batch at a time (`lines_batches`); a BigQuery table's rows come from the Storage Read API
(`table_instances`). A bad instance is an error record, and the others are still predicted."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from deploy.batch_prediction.instance_config import InstanceConfig
from deploy.batch_prediction.output import Writer, error_json, error_record
from deploy.cloud import api
from deploy.serving.instances import NUMBER, Fields, InstanceError, NotJson, Predictor, parse_json
from trainer.errors import InputError

FORMATS = ("jsonl", "csv", "bigquery")


def check_table(sources: Sequence[str]) -> list[str]:
    """The one `bq://` table a bigquery job reads."""
    if len(sources) != 1 or not str(sources[0]).startswith("bq://"):
        raise api.DeployError(
            f"--source ({', '.join(sources)}): a bigquery job reads one table, "
            "bq://PROJECT.DATASET.TABLE."
        )
    return [sources[0]]


def table_instances(
    uri: str, fields: Fields, config: InstanceConfig
) -> Iterator[tuple[str, Any, Any, str | None]]:
    """(where, the instance for the model or as read, its key, why it does not fit or None)
    of every row of a BigQuery table, its values as training reads them
    (`trainer/input/formats/bigquery.py`), stream by stream; `where` names the table, the
    stream and the row. Through the emulator in BIGQUERY_STORAGE_EMULATOR_HOST, if set; the
    URI names its project (or GOOGLE_CLOUD_PROJECT does). The read session is created at
    once: a table that cannot be read raises InputError here, before any row is asked for."""
    from trainer.input.formats import bigquery
    from trainer.input.options import BigQueryConnection

    connection = BigQueryConnection(
        project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None,
        emulator_host=os.environ.get("BIGQUERY_STORAGE_EMULATOR_HOST") or None,
    )
    source = bigquery.open_table(uri, flag="--source", connection=connection)

    def instances():
        for index, stream in enumerate(source.files):
            for number, row in enumerate(bigquery.rows(stream, source.state), start=1):
                instance, reason = checked(fields, row, config, typed=True)
                yield f"{uri} stream {index} row {number}", instance, key_of(row, config), reason

    return instances()


def check_format(instances_format: str) -> None:
    if instances_format not in FORMATS:
        raise api.DeployError(
            f"--instances_format ({instances_format!r}) must be one of {', '.join(FORMATS)}."
        )


def csv_header(path: str) -> list[str]:
    """The column names in the first line of a CSV file (optionally .gz), read by the
    trainer's reader (DeployError naming the file when it cannot be read, is empty, or its
    names are empty or repeated)."""
    from trainer.input.formats import csv as csv_format

    try:
        return list(csv_format.csv_header(path, flag="--source"))
    except InputError as e:
        raise api.DeployError(str(e)) from None


def check_header(path: str, header: list[str], fields: Fields, config: InstanceConfig) -> None:
    """Fails naming the file and the columns when its header cannot fit the model (the
    columns `config` sends to it) or lacks the key column."""
    expected = ", ".join(fields.kinds)
    if not header:
        raise api.DeployError(
            f"{path} is empty: it needs a header row naming the model's "
            f"columns ({expected}), then rows."
        )
    if config.key_field and config.key_field not in header:
        raise api.DeployError(
            f"{path}: the header has no column {config.key_field} (--key_field); it names "
            f"{', '.join(header)}."
        )
    columns = set(config.sent(header))
    missing = [name for name in fields.kinds if name not in columns]
    if len(missing) == len(fields.kinds) and not set(header) & set(fields.kinds):
        raise api.DeployError(
            f"{path}: the first line ({','.join(header)}) names none of the "
            f"model's columns; it must be a header row naming them: "
            f"{expected}."
        )
    if missing:
        them = "it" if len(missing) == 1 else "them"
        dropped = (
            f" once {config.dropped_by(missing[0])} drops {them}" if missing[0] in header else ""
        )
        raise api.DeployError(
            f"{path}: the header has no column {', '.join(missing)}"
            f"{dropped}; the model takes {expected}."
        )
    unknown = [name for name in header if name in columns and name not in fields.kinds]
    if unknown:
        how = (
            "leave it out of --included_fields"
            if config.included_fields
            else f"drop it with --excluded_fields={','.join(unknown)}"
        )
        raise api.DeployError(
            f"{path}: the header names {', '.join(unknown)}, which the model does not take; {how}."
        )


def checked(fields: Fields, instance, config: InstanceConfig, *, typed: bool):
    """(instance ready for the model, None) or (the instance as read, the reason): `typed`
    instances (from JSON) are checked, others (text from CSV) typed by the model's fields;
    the fields `config` does not send are dropped first; an array is the values of its
    included fields."""
    if isinstance(instance, list):
        as_object, reason = config.as_object(instance)
        if as_object is None:
            return instance, reason
        instance = as_object
    if isinstance(instance, dict):
        if config.key_field and config.key_field not in instance:
            return instance, f"no field '{config.key_field}' (--key_field)."
        instance = config.for_model(instance)
    try:
        if typed:
            return fields.check(0, instance), None
        return fields.from_text(0, instance), None
    except InstanceError as e:
        return instance, e.reason


def key_of(instance, config: InstanceConfig):
    """The instance's key (None without --key_field, or for an instance that is no object)."""
    if config.key_field and isinstance(instance, dict):
        return instance.get(config.key_field)
    return None


def csv_row(path: str, line: int, text: str, header: list[str]):
    """(where, the row as read: a dict, or the list of fields when it has the wrong number,
    and why it has the wrong number or None)."""
    row = next(csv.reader([text], skipinitialspace=True), [])
    where = f"{path}:{line}"
    if len(row) != len(header):
        return (
            where,
            row,
            (f"{len(row)} fields, the header has {len(header)} (quote values that contain commas)"),
        )
    return where, dict(zip(header, row)), None


# -- CSV: parsed and formatted by TensorFlow ----------------------------------------------------
def csv_batches(
    headers: dict[str, list[str]], batch_size: int, write: Writer
) -> Iterator[tuple[bytes, int, list[str]]]:
    """(result lines, how many, error records) for each batch of every file, the files with
    one header read by one dataset. Parsing, the model and the JSON lines all run in the
    dataset's parallel map."""
    from trainer.input import blocks as blocks_lib
    from trainer.input import rows as rows_lib
    from trainer.input.formats import base
    from trainer.input.formats import csv as csv_format

    predictor, config = write.predictor, write.config
    fields = predictor.fields
    key = config.key_field
    columns = rows_lib.Columns(
        numeric=tuple(n for n, k in fields.kinds.items() if k == NUMBER),
        categorical=(*(n for n, k in fields.kinds.items() if k != NUMBER), *([key] if key else [])),
    )
    groups: dict[tuple[str, ...], list[str]] = {}
    for path, header in headers.items():
        groups.setdefault(tuple(header), []).append(path)
    for columns_of_file, paths in groups.items():
        source = base.Source(
            "--source", ",".join(paths), tuple(paths), csv_format.CSV, columns_of_file
        )
        parser = rows_lib.RowParser(source, columns)
        header = list(columns_of_file)  # this group's, which describes its bad rows
        predict = _csv_predictor(parser, config.sent(header), key, predictor)
        # A file cut short ends where it stops being whole (not raised inside tf.data, where
        # TensorFlow would log the exception's traceback); it stops the run below.
        notes = blocks_lib.Notes()
        dataset = (
            source.blocks(
                source.indexed_files(), parallel=1, deterministic=True, lost_tails=True, notes=notes
            )
            .rebatch(batch_size)
            .map(
                tf.autograph.experimental.do_not_convert(predict),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
            .prefetch(2)
        )
        for block in dataset:
            lines, count, errors = _rows_for_python(block, paths, header, config, write)
            yield _utf8(block["text"].numpy()) + lines, int(block["count"]) + count, errors
        if notes.lost:  # the files were read to their ends: one cut short stops the run
            raise blocks_lib.TruncatedInput(next(iter(notes.lost.values())))


def _csv_predictor(parser, shown: list[str], key: str | None, predictor: Predictor) -> Callable:
    """What the dataset's map does to a block of CSV lines: parse, predict the rows TensorFlow
    can write, and write their result lines; the rows whose text needs escaping, and the bad
    ones, are left to Python (`_rows_for_python`)."""
    fields = predictor.fields

    def predict(file, line, text):
        parsed = parser.parse(file, line, text)
        # A missing number (NaN) is predicted as the model's preprocessing takes it; text
        # where a number belongs is not.
        bad = (
            tf.reduce_any(tf.stack([*parsed.not_a_number.values(), parsed.malformed]), axis=0)
            & ~parsed.blank
        )
        good = parsed.take(~bad & ~parsed.blank)
        features = good.features()
        if key:
            text, plain = _text_pieces(features[key])
            instances = tf.strings.join(text)
        else:
            instances, plain = _instance_json(features, shown, fields)
        # Rows whose text needs escaping (and bad rows) are written by Python.
        tf_rows, python_rows, bad_rows = good.take(plain), good.take(~plain), parsed.take(bad)
        model_features = {n: v for n, v in tf_rows.features().items() if n in fields.kinds}
        return {
            "text": _prediction_json(
                tf.boolean_mask(instances, plain),
                predictor.predict_tensors(model_features),
                "key" if key else "instance",
            ),
            "count": tf.size(tf_rows.line),
            "python": (python_rows.file, python_rows.line, python_rows.text),
            "bad": (bad_rows.file, bad_rows.line, bad_rows.text),
        }

    return predict


def _rows_for_python(
    block: dict, paths: list[str], header: list[str], config: InstanceConfig, write: Writer
) -> tuple[bytes, int, list[str]]:
    """The block's rows TensorFlow left to Python: each read again, the good ones predicted
    and written (`write`), the bad ones error records."""
    fields = write.predictor.fields
    python, keys, errors = [], [], []
    for file, line, text in zip(
        *(np.concatenate([block[k][i].numpy() for k in ("bad", "python")]) for i in range(3))
    ):
        where, row, row_key, reason = read_instance(
            paths[int(file)], int(line), text.decode("utf-8", "replace"), fields, config, header
        )
        if reason is None:
            python.append(row)
            keys.append(row_key)
        else:
            errors.append(json.dumps(error_record(where, row, reason)))
    return write(python, keys), len(python), errors


def _instance_json(features: dict, names: list[str], fields: Fields):
    """Each row's instance as a JSON object (keys in `names` order; numbers in their
    shortest float32 form, a missing one null), and whether TensorFlow could write it: text
    with a quote, a backslash or a control character needs escaping, which Python does (it is
    rare, and one check per value costs a quarter of escaping every value)."""
    pieces, plain = [], tf.ones(tf.shape(next(iter(features.values()))), tf.bool)
    for i, name in enumerate(names):
        value = features[name]
        key = ("{" if i == 0 else ", ") + json.dumps(name) + ": "
        if fields.kinds[name] == NUMBER:
            pieces += [key, _number_json(value)]
        else:
            text, written = _text_pieces(value)
            plain &= written
            pieces += [key, *text]
    return tf.strings.join(pieces + ["}"]), plain  # one join: each costs as much as a format


def _text_pieces(value: tf.Tensor) -> tuple[list, tf.Tensor]:
    """Text as the pieces of a JSON string, and whether TensorFlow can write it unescaped
    (`_instance_json`)."""
    plain = tf.strings.regex_full_match(value, '[^\\\\"\\x00-\\x1f]*')
    return ['"', value, '"'], plain


def _number_json(value: tf.Tensor) -> tf.Tensor:
    """Numbers as JSON: the shortest float32 form, null where not finite (missing)."""
    return tf.where(tf.math.is_finite(value), tf.strings.as_string(value, shortest=True), "null")


def _quoted(text: tf.Tensor) -> tf.Tensor:
    escaped = tf.strings.regex_replace(tf.strings.regex_replace(text, r"\\", r"\\\\"), '"', '\\\\"')
    return tf.strings.join(['"', escaped, '"'])


def _utf8(text: bytes) -> bytes:
    """`text`, with any byte that is not UTF-8 (from a CSV field) made U+FFFD, as JSON
    needs."""
    try:
        text.decode("utf-8")
        return text
    except UnicodeDecodeError:
        return text.decode("utf-8", "replace").encode()


def _prediction_json(instances: tf.Tensor, outputs: dict, name: str = "instance") -> tf.Tensor:
    """`{"instance": ..., "prediction": {...}}` lines (`name`: "key" for a key's) joined into
    one text (empty for no rows), outputs in name order as `rows_of` writes them: one value
    per row, or a list for a row of several."""
    pieces = [f'{{"{name}": ', instances, ', "prediction": ']
    for i, name in enumerate(sorted(outputs)):
        value = outputs[name]
        if value.dtype == tf.string:  # class names: the training labels, escaped by json
            text = _quoted(value)
        elif value.dtype.is_floating:
            text = _number_json(value)
        else:
            text = tf.strings.as_string(value)
        key = ("{" if i == 0 else ", ") + json.dumps(name) + ": "
        if value.shape.rank == 2:  # a list of a known length
            pieces += [key + "["]
            for j in range(value.shape[1]):
                pieces += [", " if j else "", text[:, j]]
            pieces += ["]"]
        else:
            pieces += [key, text]
    return tf.strings.reduce_join(tf.strings.join(pieces + ["}}\n"]))


# -- JSON Lines: parsed by Python, a batch at a time ---------------------------------------------
def lines_batches(
    headers: dict[str, list[str]], batch_size: int, write: Writer, *, csv_format: bool
) -> Iterator[tuple[bytes, int, list[str]]]:
    """(result lines, how many, error records) for each batch of instances read by Python:
    JSON Lines, or (`csv_format`) CSV rows under each file's header (`headers`)."""
    from trainer.input import blocks as blocks_lib

    fields, config = write.predictor.fields, write.config

    def instances():
        for path, header in headers.items():
            for chunk, first in blocks_lib.line_chunks(path):
                for number, raw in enumerate(
                    chunk.decode("utf-8-sig", "replace").split("\n"), start=first
                ):
                    if not raw.strip() or (csv_format and number == 1):
                        continue
                    yield (
                        *read_instance(
                            path, number, raw, fields, config, header if csv_format else None
                        ),
                        raw,
                    )

    return batched(instances(), batch_size, write)


def batched(
    instances: Iterator[tuple[str, Any, Any, str | None, str]], batch_size: int, write: Writer
) -> Iterator[tuple[bytes, int, list[str]]]:
    """(result lines, how many, error records) for each `batch_size` good instances of
    (where, the instance, its key, why it does not fit or None, its text)."""
    good: list[dict] = []
    keys: list = []
    errors: list[str] = []
    for where, instance, key, reason, raw in instances:
        if reason is None:
            good.append(instance)
            keys.append(key)
        else:
            errors.append(error_json(where, instance, reason, text=raw))
        if len(good) == batch_size:
            yield write(good, keys), len(good), errors
            good, keys, errors = [], [], []
    if good or errors:
        yield write(good, keys), len(good), errors


def read_instance(
    path: str,
    number: int,
    text: str,
    fields: Fields,
    config: InstanceConfig,
    header: list[str] | None = None,
) -> tuple[str, Any, Any, str | None]:
    """(where, the instance for the model or as read, its key, why it does not fit or None)
    of line `number` of a file: a CSV row under `header`, else a JSON line, checked as the
    server checks an instance."""
    if header is not None:
        where, read, reason = csv_row(path, number, text, header)
        key = key_of(read, config)
        if reason is not None:
            return where, read, key, reason
        instance, reason = checked(fields, read, config, typed=False)
        return where, instance, key, reason
    try:
        read = parse_json(text, "the line")
    except NotJson as e:
        return f"{path}:{number}", text, None, str(e)
    instance, reason = checked(fields, read, config, typed=True)
    return f"{path}:{number}", instance, key_of(read, config), reason
