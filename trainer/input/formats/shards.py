"""CSV shards a parameter-server cluster's chief stages of an input its workers cannot read.

Under ParameterServerStrategy the workers run the dataset function the chief traces, which
cannot call back into Python, so they cannot read a format converted there (JSON Lines,
BigQuery, Parquet: `Format.in_graph` is False). There the chief stages each such input once,
before its scan: the format writes the very CSV lines its reader gives the row parser as
gzipped CSV shards `JOB_DIR/data/<train|eval>-<part of the input>-<part>.csv.gz` (a new part
every `ROWS_PER_SHARD` rows) with a header, so the scan finds the same values and kinds.
Then the job reads the shards as if the user had passed them: sharded across workers, cached
or streamed, read as `StagedCsv` (CSV whose column kinds and bad rows are described by the
format staged).

Each shard is written under a temporary name and renamed when whole; the manifest
`JOB_DIR/data/<train|eval>.json` (the format, what was staged, the shards and their rows) is
written last, in one step. So a chief that restarts finds either a complete staging, which it
reuses without reading the input again (`Format.reuse_staged`), or none (it deletes the shards
of an unfinished one and stages anew). schema.json records the manifest: workers, the
evaluator and a resume read the shards, never the input (`Format.open_staged`).

Cost: one pass over the input, then the scan and training read the shards; and the shards'
storage in the job dir (gzipped CSV: 1.4 MB for a 100,000-row, 7-column table).
"""

from __future__ import annotations

import csv
import gzip
import io
import time
from collections.abc import Callable, Iterable

import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.input.formats.base import Format, Source
from trainer.input.formats.csv import Csv
from trainer.input.schema import ColumnChoices
from trainer.storage import files as storage
from trainer.storage import job_dir as job_dir_lib

ROWS_PER_SHARD = 500_000
# gzip's fastest level: staging is one pass the job waits for, and shards are read a few times.
_GZIP_LEVEL = 1


class StagedCsv(Csv):
    """CSV shards staged of an input in format `origin`: read as CSV, with the column kinds
    the origin's own types give (a STRING column of a table stays categorical)."""

    def __init__(self, origin: Format):
        self.origin = origin

    def column_choices(self, source: Source, choices: ColumnChoices) -> ColumnChoices:
        return self.origin.column_choices(source, choices)

    def __repr__(self) -> str:
        return f"<CSV shards of {self.origin.title}>"


def source(
    origin: Format, *, flag: str, pattern: str, manifest: dict, state: object = None
) -> Source:
    """The shards of `manifest` as a Source named after the input they were staged of."""
    files = tuple(f["path"] for f in manifest["files"])
    columns = tuple(manifest["columns"])
    return Source(flag, pattern, files, StagedCsv(origin), columns, state=state, staged=manifest)


# -- inputs of files, converted file by file ---------------------------------------------------
def stage_files(
    fmt: Format,
    source: Source,
    lines: Callable[[str], Iterable[bytes]],
    *,
    folder: str,
    name: str,
    extra: dict | None = None,
) -> dict:
    """Writes the CSV lines `lines(path)` gives of each file of `source` as shards
    `folder/name-<file>-<part>.csv.gz` (each file's lines in order), then the manifest (with
    `extra`); returns the manifest. Files are converted one at a time (a converter may hold
    the GIL)."""
    started = start(folder, name)
    columns = header(source.columns)

    def one(index: int, path: str) -> list[tuple[str, int]]:
        prefix = f"{folder}/{name}-{index:05d}"
        return storage.retry(
            lambda: write_chunks(lines(path), columns, prefix), what=f"staging {path} into {folder}"
        )

    written = [
        shard
        for index, path in enumerate(source.files)
        for shard in entries(index, one(index, path))
    ]
    manifest = {
        "format": fmt.name,
        fmt.name: source.pattern,
        "inputs": _sizes(source.files),
        "columns": list(source.columns),
        "files": written,
        **(extra or {}),
    }
    publish(folder, name, manifest, what=source.pattern, started=started)
    return manifest


def reuse_files(
    fmt: Format, pattern: str, files: tuple[str, ...], *, flag: str, options, folder: str, name: str
) -> Source | None:
    """The shards of `pattern` (`stage_files`) a previous start staged of the same files (and
    sizes) with the same columns, or None."""
    manifest = read_manifest(folder, name)
    if manifest is None or manifest.get(fmt.name) != pattern or not has_origins(manifest):
        return None
    if manifest.get("inputs") != _sizes(files):
        return None  # other files': staged anew
    if tuple(manifest["columns"]) != fmt.open(pattern, files, flag=flag, options=options).columns:
        return None
    logging.info("%s: reusing the %d shards staged in %s.", pattern, len(manifest["files"]), folder)
    return fmt.open_staged(pattern, flag=flag, options=options, manifest=manifest)


def open_files(fmt: Format, pattern: str, *, flag: str, manifest: dict, state=None) -> Source:
    """The shards of `manifest` (`stage_files`); fails when they were staged of other files."""
    if manifest[fmt.name] != pattern:
        raise InputError(
            f"{flag}={pattern}, but the job in this --job_dir reads {manifest[fmt.name]}. "
            "Resume with the same files, or train on these in a new --job_dir."
        )
    return source(fmt, flag=flag, pattern=pattern, manifest=manifest, state=state)


def entries(origin: int, written: list[tuple[str, int]]) -> list[dict]:
    """The manifest's entries of the shards `written` of the input's file (or stream) number
    `origin`, each with the number of the row of that file its first row is (rows count from
    1 in each file): `Source.origin` maps a shard's rows back, so the hold-out is the same
    rows whether the input is read or its shards are."""
    out, first_row = [], 1
    for path, rows in written:
        out.append({"path": path, "rows": rows, "origin": origin, "first_row": first_row})
        first_row += rows
    return out


def has_origins(manifest: dict) -> bool:
    """Whether a staging records where its rows came from (one of an older version did not:
    it is staged anew)."""
    return all("origin" in f for f in manifest["files"])


def _sizes(files: Iterable[str]) -> list[dict]:
    """Each file with its size: a staging is reused only for the same files."""

    def size(path: str) -> int:
        return storage.retry(lambda: tf.io.gfile.stat(path).length, what=f"reading {path}")

    return [{"path": f, "bytes": size(f)} for f in files]


# -- the manifest and the shards ---------------------------------------------------------------
def manifest_path(folder: str, name: str) -> str:
    return job_dir_lib.join(folder, f"{name}.json")


def read_manifest(folder: str, name: str) -> dict | None:
    """The manifest a finished staging of `name` wrote last, or None (none, or unfinished)."""
    path = manifest_path(folder, name)
    if not storage.retry(lambda: tf.io.gfile.exists(path), what=f"reading {path}"):
        return None
    return job_dir_lib.read_json(path)


def publish(folder: str, name: str, manifest: dict, *, what: str, started: float) -> None:
    """Writes the manifest of a finished staging (`started`: its time.monotonic())."""
    job_dir_lib.write_json(manifest_path(folder, name), manifest)
    seconds = time.monotonic() - started
    rows = sum(f["rows"] for f in manifest["files"])
    logging.info(
        "Staged %s: %d rows in %d shards under %s in %.1f s (%.0f rows/s).",
        what,
        rows,
        len(manifest["files"]),
        folder,
        seconds,
        rows / max(seconds, 1e-9),
    )


def remove(folder: str, name: str) -> None:
    """Deletes the manifest and the shards (whole or not) of `name` in `folder`."""
    if not tf.io.gfile.isdir(folder):
        return
    for entry in tf.io.gfile.listdir(folder):
        if entry.startswith((f"{name}-", f"{name}.json")):
            tf.io.gfile.remove(job_dir_lib.join(folder, entry))


def start(folder: str, name: str) -> float:
    """Clears what an unfinished staging of `name` left; returns the time.monotonic()."""
    remove(folder, name)
    tf.io.gfile.makedirs(folder)
    return time.monotonic()


def header(columns: tuple[str, ...]) -> bytes:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerow(columns)
    return text.getvalue().encode()


def write_chunks(
    chunks: Iterable[bytes], header: bytes, prefix: str, rows_per_shard: int | None = None
) -> list[tuple[str, int]]:
    """Writes chunks of CSV lines (each without its last line end) as shards
    `prefix-0000.csv.gz`, ... of `rows_per_shard` rows each (default `ROWS_PER_SHARD`);
    returns (path, rows) of each."""
    rows_per_shard = rows_per_shard or ROWS_PER_SHARD
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
        """CSV lines without the last line end."""
        self._gzip.write(lines + b"\n")
        self.rows += lines.count(b"\n") + 1

    def publish(self) -> tuple[str, int]:
        self._gzip.close()
        self._file.close()
        tf.io.gfile.rename(self.temp, self.path, overwrite=True)
        return self.path, self.rows
