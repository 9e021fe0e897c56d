"""BigQuery tables staged into the job dir as CSV shards, for a cluster with parameter servers.

Under ParameterServerStrategy the workers run the dataset function the chief traces, which
cannot call back into Python, so they cannot run the Storage Read reader
(`trainer/input/bigquery.py`). There the chief stages each `bq://` input once, before its
scan: every read stream of its session is written as gzipped CSV shards
`JOB_DIR/data/<train|eval>-<stream>-<part>.csv.gz` (a new part every `ROWS_PER_SHARD` rows),
the same CSV lines the streaming reader parses (so every value, and each column's kind from
the table schema, is what reading the table gives), with a header. Then the job reads the
shards as if the user had passed them: sharded across workers, cached or streamed.

Each shard is written under a temporary name and renamed when whole; the manifest
`JOB_DIR/data/<train|eval>.json` (the table, its read session and the shards) is written
last, in one step. So a chief that restarts finds either a complete staging, which it reuses
without reading the table again, or none (it deletes the shards of an unfinished one and
stages anew). schema.json records the manifest: workers, the evaluator and a resume read the
shards, never the table (a resume does not depend on the 6-hour read session).

Cost: one pass over the table (ReadRows of every stream, `_THREADS` at a time), then the
scan and training read the shards; and the shards' storage in the job dir (gzipped CSV: 1.4 MB
for a 100,000-row, 7-column emulator table).
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import gzip
import io
import time

import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.input import bigquery
from trainer.input import files as files_lib
from trainer.input.bigquery import Session, Table
from trainer.input.files import Source
from trainer.input.options import BigQueryConnection
from trainer.storage import files as storage
from trainer.storage import job_dir as job_dir_lib

ROWS_PER_SHARD = 500_000
# Streams written at once: each is a gRPC read, a CSV writer and gzip, which release the GIL.
_THREADS = 8
# gzip's fastest level: staging is one pass the job waits for, and shards are read a few times.
_GZIP_LEVEL = 1


@dataclasses.dataclass(frozen=True)
class Staged:
    """A finished staging: the table's read session, the shards in order and their rows."""

    session: Session
    columns: tuple[str, ...]
    files: tuple[str, ...]
    rows: tuple[int, ...]

    def to_json(self) -> dict:
        return {
            "table": self.session.table,
            "session": self.session.to_json(),
            "columns": list(self.columns),
            "files": [{"path": p, "rows": r} for p, r in zip(self.files, self.rows)],
        }

    @classmethod
    def from_json(cls, data: dict, connection: BigQueryConnection) -> Staged:
        return cls(
            Session.from_json(data["session"], connection),
            tuple(data["columns"]),
            tuple(f["path"] for f in data["files"]),
            tuple(int(f["rows"]) for f in data["files"]),
        )

    def source(self, flag: str, uri: str) -> Source:
        """The shards as a CSV `Source` named after the table; its session carries the
        table's column types (`bigquery.table_choices`)."""
        return Source(flag, uri, self.files, files_lib.CSV, self.columns, session=self.session)


def is_staged(source: Source) -> bool:
    """A table's shards (a CSV source with the table's session)."""
    return source.session is not None and source.format == files_lib.CSV


def open_recorded(uri: str, *, flag: str, connection: BigQueryConnection, data: dict) -> Source:
    """The shards a job staged (schema.json's record, or a manifest) of table `uri`; fails
    when the job staged another table."""
    table = Table.parse(uri, flag=flag, default_project=connection.project)
    staged = Staged.from_json(data, connection)
    if staged.session.table != str(table):
        raise InputError(
            f"{flag}={uri}, but the job in this --job_dir reads {staged.session.table}. Resume "
            "with the same table, or train on this one in a new --job_dir."
        )
    return staged.source(flag, uri)


def manifest_path(folder: str, name: str) -> str:
    return job_dir_lib.join(folder, f"{name}.json")


def _manifest(folder: str, name: str) -> dict | None:
    """The manifest a finished staging of `name` wrote last, or None (none, or unfinished)."""
    path = manifest_path(folder, name)
    if not storage.retry(lambda: tf.io.gfile.exists(path), what=f"reading {path}"):
        return None
    return job_dir_lib.read_json(path)


def finished(uri: str, *, flag: str, connection: BigQueryConnection, folder: str, name: str):
    """The shards of table `uri` a previous start of this job staged completely, or None."""
    data = _manifest(folder, name)
    if data is None:
        return None
    table = Table.parse(uri, flag=flag, default_project=connection.project)
    if data.get("table") != str(table):
        return None  # another table's: staged anew
    logging.info("%s: reusing the %d shards staged in %s.", uri, len(data["files"]), folder)
    return open_recorded(uri, flag=flag, connection=connection, data=data)


def stage(source: Source, *, folder: str, name: str, rows_per_shard: int | None = None) -> Source:
    """Writes the streams of table `source` as CSV shards `folder/name-*.csv.gz` and the
    manifest `folder/name.json` last; returns the shards as a Source."""
    assert source.format == files_lib.BIGQUERY and source.session is not None
    session = source.session
    rows_per_shard = rows_per_shard or ROWS_PER_SHARD
    remove(folder, name)  # what an unfinished staging left
    tf.io.gfile.makedirs(folder)
    started = time.monotonic()
    header = _header(source.columns)

    def one(item: tuple[int, str]) -> list[tuple[str, int]]:
        index, stream = item
        return storage.retry(
            lambda: _write_stream(
                stream, session, header, f"{folder}/{name}-{index:05d}", rows_per_shard
            ),
            what=f"staging {source.pattern} into {folder}",
        )

    threads = max(1, min(_THREADS, len(source.files)))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        shards = [s for stream in pool.map(one, enumerate(source.files)) for s in stream]
    if not shards:
        raise InputError(f"{source.flag}: BigQuery table {source.pattern} holds no rows.")
    staged = Staged(
        session, source.columns, tuple(p for p, _ in shards), tuple(r for _, r in shards)
    )
    job_dir_lib.write_json(manifest_path(folder, name), staged.to_json())
    seconds = time.monotonic() - started
    rows = sum(staged.rows)
    logging.info(
        "Staged %s: %d rows in %d shards under %s in %.1f s (%.0f rows/s).",
        source.pattern,
        rows,
        len(shards),
        folder,
        seconds,
        rows / max(seconds, 1e-9),
    )
    return staged.source(source.flag, source.pattern)


# -- JSON Lines ------------------------------------------------------------------------------
# JSON Lines files are converted to CSV lines in Python (trainer/input/jsonl.py), which a
# parameter-server worker's dataset cannot call either: the chief converts them once, the same
# way, into shards `folder/name-<file>-<part>.csv.gz` (each file's lines in order, so shard
# line n + 1 is the file's line n under the header), the manifest `folder/name.json` last. The
# shards hold the very CSV lines the JSON Lines reader gives the row parser, so the scan finds
# the same column kinds, and a converted bad line is still described as a JSON one
# (`jsonl.describe_malformed`).
def _jsonl_inputs(source: Source) -> list[dict]:
    """The JSON Lines files with their sizes: a staging is reused only for the same files."""

    def size(path: str) -> int:
        return storage.retry(lambda: tf.io.gfile.stat(path).length, what=f"reading {path}")

    return [{"path": f, "bytes": size(f)} for f in source.files]


def is_jsonl_manifest(data: dict) -> bool:
    return "jsonl" in data


def open_recorded_jsonl(pattern: str, *, flag: str, data: dict) -> Source:
    """The shards a job staged of JSON Lines files `pattern` (schema.json's record, or a
    manifest), as a CSV source with the JSON files' columns."""
    if data["jsonl"] != pattern:
        raise InputError(
            f"{flag}={pattern}, but the job in this --job_dir reads {data['jsonl']}. Resume "
            "with the same files, or train on these in a new --job_dir."
        )
    files = tuple(f["path"] for f in data["files"])
    return Source(flag, pattern, files, files_lib.CSV, tuple(data["columns"]))


def finished_jsonl(source: Source, *, folder: str, name: str) -> Source | None:
    """The shards of JSON Lines `source` a previous start of this job staged completely (of
    the same files, sizes and columns), or None."""
    assert source.format == files_lib.JSONL
    data = _manifest(folder, name)
    if data is None:
        return None
    if (
        data.get("jsonl") != source.pattern
        or data.get("inputs") != _jsonl_inputs(source)
        or tuple(data.get("columns", ())) != source.columns
    ):
        return None  # other files': staged anew
    logging.info(
        "%s: reusing the %d shards staged in %s.", source.pattern, len(data["files"]), folder
    )
    return open_recorded_jsonl(source.pattern, flag=source.flag, data=data)


def stage_jsonl(
    source: Source, *, folder: str, name: str, rows_per_shard: int | None = None
) -> Source:
    """Converts JSON Lines `source` into CSV shards `folder/name-*.csv.gz` and writes the
    manifest `folder/name.json` last; returns the shards as a CSV Source."""
    from trainer.input import jsonl

    assert source.format == files_lib.JSONL
    rows_per_shard = rows_per_shard or ROWS_PER_SHARD
    remove(folder, name)  # what an unfinished staging left
    tf.io.gfile.makedirs(folder)
    started = time.monotonic()
    header = _header(source.columns)
    inputs = _jsonl_inputs(source)

    def one(item: tuple[int, str]) -> list[tuple[str, int]]:
        index, path = item
        return storage.retry(
            lambda: _write_chunks(
                (lines for lines, _ in jsonl.csv_chunks(path, source.columns)),
                header,
                f"{folder}/{name}-{index:05d}",
                rows_per_shard,
            ),
            what=f"staging {path} into {folder}",
        )

    # One file at a time: the json module's fallback holds the GIL.
    shards = [s for item in enumerate(source.files) for s in one(item)]
    data = {
        "jsonl": source.pattern,
        "inputs": inputs,
        "columns": list(source.columns),
        "files": [{"path": p, "rows": r} for p, r in shards],
    }
    job_dir_lib.write_json(manifest_path(folder, name), data)
    seconds = time.monotonic() - started
    logging.info(
        "Staged %s: %d lines in %d shards under %s in %.1f s.",
        source.pattern,
        sum(r for _, r in shards),
        len(shards),
        folder,
        seconds,
    )
    return open_recorded_jsonl(source.pattern, flag=source.flag, data=data)


def remove(folder: str, name: str) -> None:
    """Deletes the manifest and the shards (whole or not) of `name` in `folder`."""
    if not tf.io.gfile.isdir(folder):
        return
    for entry in tf.io.gfile.listdir(folder):
        if entry.startswith((f"{name}-", f"{name}.json")):
            tf.io.gfile.remove(job_dir_lib.join(folder, entry))


def _header(columns: tuple[str, ...]) -> bytes:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerow(columns)
    return text.getvalue().encode()


def _write_stream(
    stream: str, session: Session, header: bytes, prefix: str, rows_per_shard: int
) -> list[tuple[str, int]]:
    """Writes one read stream as shards `prefix-0000.csv.gz`, ... of `rows_per_shard` rows
    each (the last one fewer); returns (path, rows) of each."""
    chunks = (lines for lines, _ in bigquery.csv_chunks(stream, session))
    return _write_chunks(chunks, header, prefix, rows_per_shard)


def _write_chunks(chunks, header: bytes, prefix: str, rows_per_shard: int) -> list[tuple[str, int]]:
    """Writes chunks of CSV lines (each without its last line end) as shards
    `prefix-0000.csv.gz`, ... of `rows_per_shard` rows each; returns (path, rows) of each."""
    shards: list[tuple[str, int]] = []
    part: _Part | None = None
    for lines in chunks:
        rest: bytes | None = lines
        while rest is not None:
            if part is None:
                part = _Part(f"{prefix}-{len(shards):04d}.csv.gz", header)
            head, rest = _split(rest, rows_per_shard - part.rows)
            part.write(head)
            if part.rows >= rows_per_shard:
                shards.append(part.publish())
                part = None
    if part is not None:
        shards.append(part.publish())
    return shards


def _split(lines: bytes, rows: int) -> tuple[bytes, bytes | None]:
    """The first `rows` lines of `lines` (CSV lines without the last line end), and the rest
    (None when nothing is left)."""
    if lines.count(b"\n") < rows:
        return lines, None
    pieces = lines.split(b"\n", rows)
    return b"\n".join(pieces[:rows]), pieces[rows]


class _Part:
    """One shard, written under a temporary name and renamed when whole."""

    def __init__(self, path: str, header: bytes):
        self.path = path
        self.temp = f"{path}.tmp"
        self.rows = 0
        self._file = tf.io.gfile.GFile(self.temp, "wb")
        self._gzip = gzip.GzipFile(
            fileobj=self._file, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0
        )
        self._gzip.write(header)

    def write(self, lines: bytes) -> None:
        """CSV lines without the last line end (a chunk of `bigquery.csv_chunks`)."""
        self._gzip.write(lines + b"\n")
        self.rows += lines.count(b"\n") + 1

    def publish(self) -> tuple[str, int]:
        self._gzip.close()
        self._file.close()
        tf.io.gfile.rename(self.temp, self.path, overwrite=True)
        return self.path, self.rows
