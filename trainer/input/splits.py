"""The splits users choose, as the Vertex AI SDK names them: a predefined split column
(`predefined_split_column_name`: each row's TRAIN, VALIDATE or TEST) or a time split
(`timestamp_split_column_name`: the oldest rows train, the newest test), instead of the
trainer's own hold-out.

The chief writes the training input's rows, as they are, into three files of the job dir
(`JOB_DIR/splits/train`, `validate`, `test`, in the input's format, gzipped), once; `done.json`
there says they are whole and counts them. The job then reads them as `--train_data`,
`--eval_data` (VALIDATE: the rows the search chooses on and the calibration fits on,
`JobInput.validation`) and `--test_data` (TEST: scored once), and the split column is not a
feature. Every replica reads the same files; a resumed job reuses them.

Predefined values (any case): `TRAIN`/`TRAINING`, `VALIDATE`/`VALIDATION`, `TEST`; a row with
another value (`UNASSIGNED`, empty) is left out and counted. Time split: each row's timestamp
(a date-time as `trainer/input/dates.py` reads it, or a number of seconds since 1970) orders
the rows; the oldest `fractions[0]` train, the next `fractions[1]` validate, the newest test
(rows at one timestamp stay together); a row without a timestamp that parses trains.

Reads CSV and JSON Lines input (local, `gs://`, `.gz`) in Python, one row at a time; other
formats are refused before any work.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import time
from collections.abc import Iterator

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.input import dates
from trainer.input import files as files_lib
from trainer.input.options import InputOptions, SplitOptions
from trainer.storage import job_dir as job_dir_lib

SPLITS = ("train", "validate", "test")
_NAMES = {
    "train": "train",
    "training": "train",
    "validate": "validate",
    "validation": "validate",
    "test": "test",
}
FORMATS = ("csv", "jsonl")


def wait_for(job_root: str, timeout_secs: float) -> None:
    """Waits until the chief has written the splits (a replica that does not write them)."""
    deadline = time.monotonic() + timeout_secs
    while not tf.io.gfile.exists(done_path(job_root)):
        if time.monotonic() > deadline:
            raise InputError(
                f"the chief did not write the splits of the training data into "
                f"{job_root}/splits within {timeout_secs:.0f} s."
            )
        time.sleep(1.0)


def paths(job_root: str, fmt: str) -> dict[str, str]:
    """Each split's file in the job dir."""
    suffix = "jsonl.gz" if fmt == "jsonl" else "csv.gz"
    return {name: job_dir_lib.join(job_root, "splits", f"{name}.{suffix}") for name in SPLITS}


def done_path(job_root: str) -> str:
    return job_dir_lib.join(job_root, "splits", "done.json")


def input_format(train_data: str, *, jsonl: bool) -> str:
    """The training input's format by its name (CSV or JSON Lines, no I/O); InputError for
    others."""
    from trainer.input.formats import registry

    first = train_data.split(",")[0].strip()
    fmt = registry.claiming(first) or registry.of_file(first)
    name = "jsonl" if jsonl else fmt.name
    if name not in FORMATS:
        raise InputError(
            f"--train_data={train_data} is {fmt.title}: --split_column and "
            "--timestamp_split_column read CSV or JSON Lines. Split the data into "
            "--train_data, --eval_data and --test_data yourself, or convert it."
        )
    return name


def write(
    split: SplitOptions, train_data: str, options: InputOptions, job_root: str
) -> dict[str, int]:
    """Writes the splits of `train_data` into the job dir (once: a finished split is reused)
    and returns the rows of each (and `left_out`). Two passes over the input: the rows'
    splits, then the rows, streamed into each split's file (under a temporary name until
    whole)."""
    if tf.io.gfile.exists(done_path(job_root)):
        return job_dir_lib.read_json(done_path(job_root))["rows"]
    fmt = input_format(train_data, jsonl=options.jsonl)
    _, files = files_lib.detect(train_data, flag="--train_data", options=options)
    header = _header(files[0], fmt)
    flag = "--split_column" if split.column else "--timestamp_split_column"
    if split.split_by not in header:
        raise InputError(
            f"{flag}={split.split_by} is not a column of {train_data}; its columns are: "
            f"{', '.join(header)}."
        )
    extra: dict = {}
    if split.column:
        assignments = [
            _NAMES.get(str(row.get(split.column) or "").strip().lower())
            for row in _rows(files, fmt)
        ]
    else:
        assignments, extra = _by_time(split, _rows(files, fmt))
    counts = {name: assignments.count(name) for name in SPLITS}
    counts["left_out"] = assignments.count(None)
    empty = [name for name in SPLITS if not counts[name]]
    if empty:
        raise InputError(
            f"{flag}={split.split_by} gives no {' and no '.join(n.upper() for n in empty)} "
            "rows: each of TRAIN, VALIDATE and TEST needs some (the values may be any case; "
            "TRAINING and VALIDATION too)."
        )
    targets = paths(job_root, fmt)
    tf.io.gfile.makedirs(job_dir_lib.join(job_root, "splits"))
    writers = {name: _Writer(targets[name] + ".tmp", fmt, header) for name in SPLITS}
    for row, name in zip(_rows(files, fmt), assignments):
        if name is not None:
            writers[name].write(row)
    for name in SPLITS:
        writers[name].close()
        tf.io.gfile.rename(targets[name] + ".tmp", targets[name], overwrite=True)
    job_dir_lib.write_json(
        done_path(job_root), {"rows": counts, **extra, "by": split.fingerprint()}
    )
    logging.info(
        "Split %s by %s: %s.",
        train_data,
        split.split_by,
        ", ".join(f"{v} {k}" for k, v in counts.items()),
    )
    return counts


def _by_time(split: SplitOptions, rows: Iterator[dict]) -> tuple[list[str | None], dict]:
    """Each row's split by its timestamp's rank, and the cut times."""
    seconds = np.array([_seconds(row.get(split.timestamp_column)) for row in rows], np.float64)
    known = np.sort(seconds[~np.isnan(seconds)])
    if not len(known):
        raise InputError(
            f"--timestamp_split_column={split.timestamp_column}: no value parses as a date-time "
            "or a number of seconds."
        )
    train_end = known[min(len(known) - 1, int(split.fractions[0] * len(known)))]
    validate_end = known[
        min(len(known) - 1, int((split.fractions[0] + split.fractions[1]) * len(known)))
    ]
    names: list[str | None] = []
    for s in seconds:
        if np.isnan(s) or s < train_end:
            names.append("train")
        elif s < validate_end:
            names.append("validate")
        else:
            names.append("test")
    return names, {"validate_from": float(train_end), "test_from": float(validate_end)}


def _seconds(value) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        parsed = dates.parse(str(value))
        return parsed.seconds if parsed else math.nan


def _rows(files: tuple[str, ...], fmt: str) -> Iterator[dict]:
    """The rows of the files as dicts, one at a time."""
    for path in files:
        lines = _lines(path)
        if fmt == "csv":
            yield from csv.DictReader(lines, skipinitialspace=True)
        else:
            yield from (json.loads(line) for line in lines if line.strip())


def _header(path: str, fmt: str) -> list[str]:
    lines = _lines(path)
    if fmt == "csv":
        return [h.strip() for h in next(csv.reader(lines), [])]
    first = next((line for line in lines if line.strip()), "{}")
    return list(json.loads(first))


def _lines(path: str) -> Iterator[str]:
    """A file's lines (line ends kept, a byte-order mark dropped), read by the trainer's
    reader: local or gs://, .gz decompressed."""
    from trainer.input import blocks

    for chunk, first in blocks.line_chunks(path):
        text = chunk.decode("utf-8", "replace")
        if first == 1:
            text = text.removeprefix("\ufeff")
        yield from text.splitlines(keepends=True)
        yield "\n"  # the chunk's last line end (chunks hold whole lines)


class _Writer:
    """Rows into a gzipped CSV (with the header) or JSON Lines file."""

    def __init__(self, path: str, fmt: str, header: list[str]):
        self.raw = tf.io.gfile.GFile(path, "wb")
        self.out = gzip.GzipFile(fileobj=self.raw, mode="wb")
        self.fmt = fmt
        self.text = io.TextIOWrapper(self.out, encoding="utf-8", newline="")
        if fmt == "csv":
            self.csv = csv.DictWriter(self.text, fieldnames=header, extrasaction="ignore")
            self.csv.writeheader()

    def write(self, row: dict) -> None:
        if self.fmt == "csv":
            self.csv.writerow(row)
        else:
            self.text.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self.text.flush()
        self.text.detach()
        self.out.close()
        self.raw.close()
