"""Local batch prediction: the twin of a Vertex AI BatchPredictionJob, streamed.

It reads the same inputs (`jsonl`, or `csv` with a header, local or gs://, `.gz` too; or a
`bigquery` table, `bq://PROJECT.DATASET.TABLE`, read with the Storage Read API) and
writes the same layout: `OUTPUT_PREFIX/prediction-<model>-<time>/` holding
`prediction.results-0000N-of-0000M` (one `{"instance": ..., "prediction": ...}` per line) and
`prediction.errors_stats-00000-of-00001` (one `{"instance": ..., "error": {"code": 3,
"message": "FILE:LINE: why"}}` per bad line; the other lines are still predicted).

Memory stays constant: CSV rows go through the trainer's input pipeline (read in chunks, parsed
in blocks by TensorFlow) and their JSON lines are formatted by TensorFlow string ops, so no
Python runs per CSV row except for bad ones; JSON Lines are parsed by Python a batch at a time.
Batch k goes to results file k mod M as it is predicted, so results are in input order within
a file, not across files (as on Vertex). The output dir appears only when complete: locally it
is written under a temporary name and renamed; on Cloud Storage each file is uploaded under a
temporary prefix and copied into place at the end, the errors file last. What a killed run
left there, the next run removes (see `_Output`). A `.gz` file cut short or corrupt stops the
run (DeployError naming it) before anything is published: read as far as it went, it would
look whole.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import fcntl
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from deploy import api, storage
from deploy.explain import Explainer
from deploy.instance_config import InstanceConfig
from deploy.instances import NUMBER, Fields, InstanceError, NotJson, Predictor, parse_json
from trainer.errors import InputError

FORMATS = ("jsonl", "csv", "bigquery")
EXPLAIN_BATCH = 32  # instances explained in one model call: 150 rows each for census
INVALID_ARGUMENT = 3  # google.rpc.Code, as Vertex writes it in errors_stats
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What a local batch prediction wrote."""

    output_dir: str
    result_files: tuple[str, ...]
    error_file: str
    num_predictions: int
    num_errors: int
    seconds: float


def predict_local(
    *,
    model_dir: str,
    sources: Sequence[str],
    output_prefix: str,
    instances_format: str = "jsonl",
    excluded_fields: Sequence[str] = (),
    key_field: str | None = None,
    included_fields: Sequence[str] = (),
    model_name: str = "model",
    batch_size: int = 4096,
    num_shards: int = 1,
    predictor: Predictor | None = None,
    explain_path_count: int | None = None,
) -> BatchResult:
    """Predicts every line of `sources` with the model in `model_dir` and writes Vertex's
    output layout under `output_prefix`, streaming (memory does not grow with the input).

    Args:
        model_dir: the exported model (`JOB_DIR/model`).
        sources: local or gs:// files or globs.
        output_prefix: where `prediction-<model_name>-<time>/` is written (local or gs://).
        instances_format: "jsonl" (a JSON object per line) or "csv" (a header, then rows).
        excluded_fields: columns dropped from each instance (Vertex's excludedFields).
        key_field: a column that identifies each instance: not sent to the model, and each
            result line has its value as `key` instead of the instance (Vertex's keyField).
        included_fields: the only columns sent to the model (Vertex's includedFields;
            exclusive with `excluded_fields`).
        model_name: names the output directory.
        batch_size: instances per prediction call.
        num_shards: result files (batch k goes to file k mod num_shards).
        predictor: a loaded model to reuse (default: load `model_dir`).
        explain_path_count: explain every instance too (`deploy/explain.py`, this many column
            orders each): each result line gets the `"explanation"` a Vertex batch job with
            explanations writes. Rows go through Python then, EXPLAIN_BATCH at a time.

    Returns:
        Where the results and errors went, and how many of each.

    Raises:
        DeployError: bad arguments, a CSV header that cannot be read (empty, not UTF-8, a
            name repeated) or does not fit the model, or a file that cannot be read whole (a
            `.gz` file cut short or corrupt); nothing is written. A bad line never raises: it
            goes to the errors file.

    Example:
        result = predict_local(model_dir="runs/job/model", sources=["test.csv"],
                               output_prefix="out", instances_format="csv",
                               excluded_fields=["income_bracket"])
    """
    check_format(instances_format)
    check_model_name(model_name)
    api.positive("batch_size", batch_size)
    api.positive("num_shards", num_shards)
    bigquery = instances_format == "bigquery"
    files = check_table(sources) if bigquery else storage.expand(list(sources))
    started = time.perf_counter()
    predictor = predictor or Predictor(model_dir)
    config = InstanceConfig.of(key_field, included_fields, excluded_fields)
    explainer = None
    if explain_path_count is not None:
        explainer = Explainer.of(predictor, explain_path_count)
        batch_size = min(batch_size, EXPLAIN_BATCH)
    write = _Writer(predictor, config, explainer)
    try:
        if instances_format == "csv":
            headers = {path: _csv_header(path) for path in files}
            for path, header in headers.items():
                check_header(path, header, predictor.fields, config)
            if explainer is None:
                batches = _csv_batches(predictor, headers, config, batch_size, write)
            else:
                batches = _lines_batches(headers, config, batch_size, write, csv_format=True)
        elif bigquery:
            rows = table_instances(files[0], predictor.fields, config)
            batches = _batched(((*r, json.dumps(r[1])) for r in rows), batch_size, write)
        else:
            batches = _lines_batches(
                {path: [] for path in files}, config, batch_size, write, csv_format=False
            )
        output = _Output(output_prefix, model_name, num_shards)
        try:
            for index, (lines, count, errors) in enumerate(batches):
                output.add_results(index, lines, count)
                output.add_errors(errors)
            result_files, error_file = output.publish()
        finally:
            output.discard()
    except InputError as e:  # a file the reader cannot read whole (a .gz cut short)
        raise api.DeployError(f"--source: {e}") from None
    return BatchResult(
        output.final_dir,
        result_files,
        error_file,
        output.results,
        output.errors,
        time.perf_counter() - started,
    )


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


def check_model_name(model_name: str) -> None:
    """A --model_name fit to be part of a directory's name under the output prefix: nothing
    that could lead out of it (a "/" or ".."), checked before anything is written."""
    if not _MODEL_NAME.fullmatch(model_name) or ".." in model_name:
        raise api.DeployError(
            f"--model_name ({model_name!r}) names the output dir prediction-<name>-<time>: "
            "use letters, digits, '.', '_' and '-' only (no '/' or '..')."
        )


def check_format(instances_format: str) -> None:
    if instances_format not in FORMATS:
        raise api.DeployError(
            f"--instances_format ({instances_format!r}) must be one of {', '.join(FORMATS)}."
        )


def _csv_header(path: str) -> list[str]:
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


def error_record(where: str, instance, reason: str) -> dict:
    return {
        "instance": instance,
        "error": {"code": INVALID_ARGUMENT, "message": f"{where}: {reason}"},
    }


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


def timestamp() -> str:
    """Vertex's directory timestamp: 2026_11_22T00_23_28_776Z."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y_%m_%dT%H_%M_%S_") + f"{now.microsecond // 1000:03d}Z"


# -- CSV: parsed and formatted by TensorFlow ----------------------------------------------------
def _csv_batches(
    predictor: Predictor,
    headers: dict[str, list[str]],
    config: InstanceConfig,
    batch_size: int,
    write: _Writer,
) -> Iterator[tuple[bytes, int, list[str]]]:
    """(result lines, how many, error records) for each batch of every file, the files with
    one header read by one dataset. Parsing, the model and the JSON lines all run in the
    dataset's parallel map."""
    from trainer.input import blocks as blocks_lib
    from trainer.input import rows as rows_lib
    from trainer.input.formats import base
    from trainer.input.formats import csv as csv_format

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
        shown = config.sent(header)

        def predict(file, line, text, parser=parser, shown=shown):
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
            python, keys, errors = [], [], []
            for file, line, text in zip(
                *(
                    np.concatenate([block[k][i].numpy() for k in ("bad", "python")])
                    for i in range(3)
                )
            ):
                where, row, row_key, reason = read_instance(
                    paths[int(file)], int(line), text.decode("utf-8", "replace"), fields,
                    config, header,
                )  # fmt: skip
                if reason is None:
                    python.append(row)
                    keys.append(row_key)
                else:
                    errors.append(json.dumps(error_record(where, row, reason)))
            lines = _utf8(block["text"].numpy()) + write(python, keys)
            yield lines, int(block["count"]) + len(python), errors
        if notes.lost:  # the files were read to their ends: one cut short stops the run
            raise blocks_lib.TruncatedInput(next(iter(notes.lost.values())))


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
def _lines_batches(
    headers: dict[str, list[str]],
    config: InstanceConfig,
    batch_size: int,
    write: _Writer,
    *,
    csv_format: bool,
) -> Iterator[tuple[bytes, int, list[str]]]:
    """(result lines, how many, error records) for each batch of instances read by Python:
    JSON Lines, or (`csv_format`) CSV rows under each file's header (`headers`)."""
    from trainer.input import blocks as blocks_lib

    fields = write.predictor.fields

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

    return _batched(instances(), batch_size, write)


def _batched(
    instances: Iterator[tuple[str, Any, Any, str | None, str]], batch_size: int, write: _Writer
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
            errors.append(_error_json(where, instance, reason, text=raw))
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


def _error_json(where: str, instance, reason: str, *, text: str) -> str:
    """The errors file's line for a bad instance; one nested almost as deeply as the parser
    allows (which writing it back, a few calls deeper, does not) is given as its `text`."""
    try:
        return json.dumps(error_record(where, instance, reason))
    except RecursionError:
        return json.dumps(error_record(where, text, reason))


@dataclasses.dataclass(frozen=True)
class _Writer:
    """The result lines of checked instances and their keys: predicted, and explained too
    where there is an explainer."""

    predictor: Predictor
    config: InstanceConfig
    explainer: Explainer | None = None

    def __call__(self, instances: list[dict], keys: list) -> bytes:
        if not instances:
            return b""
        if self.explainer is None:
            predictions = self.predictor.predict_checked(instances)
            explanations: list = [None] * len(instances)
        else:
            predictions, explanations = self.explainer.explain(instances)
        lines = []
        for instance, prediction, key, explanation in zip(
            instances, predictions, keys, explanations
        ):
            line = self.config.outputs(instance, prediction, key)
            if explanation is not None:
                line["explanation"] = explanation
            lines.append(json.dumps(line) + "\n")
        return "".join(lines).encode()


# -- the output dir --------------------------------------------------------------------------
_TEMP = ".tmp-"  # starts the name of a run's temporary dir
_LOCK = ".lock"  # in a local temporary dir: locked by its run for as long as it lives
_LEFTOVER_AFTER_S = 3600  # a temporary dir no lock vouches for, unchanged this long, is dead
_BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: one kernel's run, one per boot


class _Output:
    """Results files written as batches come, under a temporary dir; `publish` puts them in
    place as one directory (local: a rename) or file by file with the errors file last (Cloud
    Storage).

    A run killed before it publishes (SIGKILL, a lost machine) leaves its temporary dir; the
    next run with the same output prefix removes it (`_remove_leftovers`). Locally each run
    holds a lock on a file in its dir, which the kernel releases when the run dies however it
    dies, so a dir whose lock is free is dead and one whose lock is held is left alone. Only
    the kernel that holds a lock is sure to see it, so the lock file names its machine (host,
    boot, pid): a dir made on another machine (an output prefix on NFS or a /gcs/ mount shared
    by several) is removed once nothing in it changed for an hour, as are those on Cloud
    Storage, where a file only appears when it is closed, at publish: a run killed before
    leaves nothing there, one killed while it copies leaves its files.
    """

    def __init__(self, output_prefix: str, model_name: str, num_shards: int):
        prefix = output_prefix.rstrip("/")
        name = f"prediction-{model_name}-{timestamp()}"
        self.final_dir = f"{prefix}/{name}"
        self.temp_dir = f"{prefix}/{_TEMP}{name}-{uuid.uuid4().hex[:8]}"
        _remove_leftovers(prefix)
        self._lock: int | None = None
        if not storage.is_gcs(prefix):  # Cloud Storage has no directories to make or lock
            os.makedirs(self.temp_dir)
            self._lock = _hold_lock(self.temp_dir)
        self.names = [f"prediction.results-{k:05d}-of-{num_shards:05d}" for k in range(num_shards)]
        self.error_name = "prediction.errors_stats-00000-of-00001"
        self._files = [tf.io.gfile.GFile(f"{self.temp_dir}/{n}", "wb") for n in self.names]
        self._errors = tf.io.gfile.GFile(f"{self.temp_dir}/{self.error_name}", "wb")
        for f in self._files + [self._errors]:
            f.write(b"")  # an untouched GFile on gs:// is never uploaded: files may be empty
        self.results = self.errors = 0

    def add_results(self, index: int, lines: bytes, count: int) -> None:
        if count:
            self._files[index % len(self._files)].write(lines)
            self.results += count

    def add_errors(self, lines: list[str]) -> None:
        if lines:
            self._errors.write("".join(line + "\n" for line in lines).encode())
            self.errors += len(lines)

    def publish(self) -> tuple[tuple[str, ...], str]:
        for f in self._files + [self._errors]:
            f.close()
        if storage.is_gcs(self.temp_dir):
            for name in self.names + [self.error_name]:
                tf.io.gfile.copy(f"{self.temp_dir}/{name}", f"{self.final_dir}/{name}")
        else:
            os.remove(f"{self.temp_dir}/{_LOCK}")  # still held: the dir is not taken for dead
            os.rename(self.temp_dir, self.final_dir)
        return (
            tuple(f"{self.final_dir}/{n}" for n in self.names),
            f"{self.final_dir}/{self.error_name}",
        )

    def discard(self) -> None:
        """Deletes the temporary dir (after a publish, or a failure)."""
        for f in self._files + [self._errors]:
            f.close()
        if tf.io.gfile.exists(self.temp_dir):
            tf.io.gfile.rmtree(self.temp_dir)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _hold_lock(directory: str) -> int:
    """Locks `directory` for this process: the descriptor of its `_LOCK` file, locked, which
    names this machine and process (`_lock_owner`). The file is locked and written before it
    takes its name, so no run ever finds it unlocked or unnamed while this one lives."""
    path = f"{directory}/{_LOCK}-{os.getpid()}"
    lock = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.write(lock, json.dumps(_lock_owner()).encode())
    os.rename(path, f"{directory}/{_LOCK}")
    return lock


def _lock_owner() -> dict:
    """Who holds a lock: the host, the boot of its kernel (two machines may share a host
    name) and the process."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:  # not Linux: the host name alone
        boot = ""
    return {"host": socket.gethostname(), "boot": boot, "pid": os.getpid()}


def _made_here(owner: bytes) -> bool:
    """Whether a lock file holding `owner` was made on this machine (by this kernel, which
    sees its lock)."""
    try:
        made = json.loads(owner)
    except ValueError:  # empty or unreadable: made by no run of this version
        return False
    here = _lock_owner()
    return isinstance(made, dict) and all(made.get(k) == here[k] for k in ("host", "boot"))


def _remove_leftovers(prefix: str) -> None:
    """Removes the temporary dirs under `prefix` that runs killed before they published left
    (see `_Output`), naming each on the log."""
    for temp in tf.io.gfile.glob(f"{prefix}/{_TEMP}prediction-*"):
        if _is_dead(temp):
            try:
                tf.io.gfile.rmtree(temp)
            except tf.errors.NotFoundError:  # another run removed it first
                continue
            logging.warning("removed %s, left by a batch prediction that was killed", temp)


def _is_held(lock: int) -> bool:
    """Whether another open file holds the lock on the file open as `lock` (a run alive)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False  # and now held by `lock`, until it is closed


def _is_dead(temp: str) -> bool:
    """Whether no run writes to the temporary dir `temp` any more: its lock, made on this
    machine, is free; or, with no lock to ask (Cloud Storage, a dir made on another machine,
    or a local run killed in the instant between making its dir and locking it), nothing in
    it changed for `_LEFTOVER_AFTER_S`."""
    if not storage.is_gcs(temp):
        try:
            lock = os.open(f"{temp}/{_LOCK}", os.O_RDONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                if _made_here(os.read(lock, 4096)):
                    return not _is_held(lock)
            finally:
                os.close(lock)
    try:
        paths = [temp, *(f"{temp}/{name}" for name in tf.io.gfile.listdir(temp))]
        changed = max(tf.io.gfile.stat(path).mtime_nsec for path in paths)
    except tf.errors.NotFoundError:  # removed meanwhile (by its run, publishing, or another)
        return False
    return time.time_ns() - changed > _LEFTOVER_AFTER_S * 1e9
