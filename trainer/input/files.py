"""Finding input files and reading what a pipeline needs to know before it starts: the format,
and the columns (every CSV file's header; the feature names and types of TFRecord files).

Paths may be local, `gs://BUCKET/...` or `/gcs/BUCKET/...`, as a path, a glob or a
comma-separated list of them. Every check here runs before any data row is read, so a wrong
path or a file with other columns stops the job at once.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import io
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tensorflow as tf

from trainer.errors import InputError
from trainer.input import gzipped
from trainer.input import jsonl as jsonl_lib

if TYPE_CHECKING:
    from trainer.input.bigquery import Session

# The census income data shipped in the package: the default input.
_PACKAGE_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
CENSUS_TRAIN = os.path.join(_PACKAGE_DATA, "census", "train.csv.gz")
CENSUS_TEST = os.path.join(_PACKAGE_DATA, "census", "test.csv.gz")
CENSUS_LABEL = "income_bracket"

CSV = "csv"
TFRECORD = "tfrecord"
JSONL = "jsonl"  # JSON Lines, read as CSV lines (trainer/input/jsonl.py)
BIGQUERY = "bigquery"  # a table's read streams, read as CSV lines (trainer/input/bigquery.py)
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz", ".tfr")

# TFRecord feature types, as tf.train.Feature names its value lists.
BYTES, INT64, FLOAT = "bytes_list", "int64_list", "float_list"
# Records read to learn a TFRecord input's feature names and types.
_SNIFF_RECORDS = 1000
# Headers are read in parallel: on Cloud Storage each one is a round trip.
_HEADER_THREADS = 16


@dataclasses.dataclass(frozen=True)
class Source:
    """One input: its files, their format and their columns.

    `columns` is the CSV header (in file order), the TFRecord feature names (sorted) or the
    keys of JSON Lines files (`jsonl.sniff_columns`), and
    `feature_types` the TFRecord type of each (`BYTES`, `INT64`, `FLOAT`); empty for CSV.
    A BigQuery table's "files" are the read streams of its `session`, its columns the table's
    (its types are in the session).
    """

    flag: str
    pattern: str
    files: tuple[str, ...]
    format: str
    columns: tuple[str, ...]
    feature_types: tuple[str, ...] = ()
    session: Session | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not self.files:
            raise ValueError(f"{self.flag}: a Source needs at least one file.")

    @staticmethod
    def compression(path: str) -> str:
        return "GZIP" if path.endswith(".gz") else ""

    def feature_type(self, column: str) -> str | None:
        """The TFRecord type of `column`; None for CSV and BigQuery."""
        if not self.feature_types or self.format != TFRECORD:
            return None
        return self.feature_types[self.columns.index(column)]

    def require(self, names, *, what: str) -> None:
        """Fails naming the columns of `names` this source lacks."""
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise InputError(
                f"{self.flag}: column(s) {missing} are missing; {what}. Columns "
                f"found in {self.files[0]}: {', '.join(self.columns)}."
            )


def expand(pattern_list: str, *, flag: str) -> list[str]:
    """Expands a comma-separated list of files or globs (in order, each glob sorted); fails if
    any part matches nothing."""
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


# Compressions this trainer does not read (gzip only, as TensorFlow's readers): by name, and
# by the first bytes of a file (for a gzip file not named *.gz).
_OTHER_COMPRESSIONS = {
    ".bz2": "bzip2",
    ".xz": "xz",
    ".zst": "Zstandard",
    ".zip": "zip",
    ".lz4": "LZ4",
    ".Z": "compress",
    ".tgz": "a gzipped tar archive",
    ".tar": "a tar archive",
    ".snappy": "Snappy",
}
_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "Zstandard",
    b"PK\x03\x04": "zip",
}


def _check_compression(files: list[str], *, flag: str) -> None:
    """Fails on a file compressed in a way this trainer does not read."""
    for path in files:
        for suffix, name in _OTHER_COMPRESSIONS.items():
            if path.endswith(suffix):
                raise InputError(
                    f"{flag}: {path} is compressed with {name}, which this trainer does not "
                    "read: decompress it, or compress it with gzip (*.gz)."
                )


def open_source(pattern_list: str, *, flag: str, jsonl: bool = False) -> Source:
    """The files of `pattern_list`, checked: one format, and the same columns in every file.
    With `jsonl` every file is read as JSON Lines, whatever its name."""
    files = expand(pattern_list, flag=flag)
    _check_compression(files, flag=flag)
    formats = [
        JSONL
        if jsonl or jsonl_lib.is_jsonl(f)
        else TFRECORD
        if f.endswith(TFRECORD_SUFFIXES)
        else CSV
        for f in files
    ]
    if len(set(formats)) > 1:
        kinds = {TFRECORD: "TFRecord", CSV: "CSV", JSONL: "JSON Lines"}
        mixed = " and ".join(kind for fmt, kind in kinds.items() if fmt in formats)
        raise InputError(
            f"{flag} mixes {mixed} files: {files[:5]}. Use one format (JSON Lines files are "
            "named *.jsonl or *.ndjson, TFRecord files *.tfrecord)."
        )
    if formats[0] == TFRECORD:
        names, types = _sniff_tfrecord(files, flag=flag)
        return Source(flag, pattern_list, tuple(files), TFRECORD, names, types)
    if formats[0] == JSONL:
        columns = jsonl_lib.sniff_columns(files, flag=flag)
        return Source(flag, pattern_list, tuple(files), JSONL, columns)
    with concurrent.futures.ThreadPoolExecutor(min(_HEADER_THREADS, len(files))) as pool:
        headers = list(pool.map(lambda f: csv_header(f, flag=flag), files))
    for path, header in zip(files, headers):
        if header != headers[0]:
            raise InputError(
                f"{flag}: {path} has columns {list(header)}, but {files[0]} has "
                f"{list(headers[0])}. All files of one input need the same "
                "columns, in the same order."
            )
    return Source(flag, pattern_list, tuple(files), CSV, headers[0])


def identities(paths: Sequence[str]) -> list[dict]:
    """Each file's size and modification time (ns), read in parallel: what a rewrite changes
    (on Cloud Storage a rewrite is a new generation, with a new update time)."""

    def one(path: str) -> dict:
        stat = tf.io.gfile.stat(path)
        return {"bytes": int(stat.length), "modified_ns": int(stat.mtime_nsec)}

    if not paths:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(_HEADER_THREADS, len(paths))) as pool:
        return list(pool.map(one, paths))


def csv_header(path: str, *, flag: str) -> tuple[str, ...]:
    """The column names in the first line of a CSV file (optionally .gz, inflated as the rows
    are: `trainer.input.gzipped`)."""
    try:
        first = _first_line(path)
    except (tf.errors.OpError, OSError) as e:
        raise InputError(f"{flag}: cannot read {path}: {getattr(e, 'message', e)}") from None
    except gzipped.Cut as e:
        raise InputError(
            f"{flag}: cannot read the first line of {path}: it {e}. Is it a gzip file, whole "
            "(not cut short by an interrupted copy or writer)? Write it again, or leave it out."
        ) from None
    try:
        # utf-8-sig: spreadsheet exports start with a byte-order mark that is not part of the
        # first column name.
        text = first.decode("utf-8-sig")
        header = next(csv.reader(io.StringIO(text)), None)
    except (UnicodeDecodeError, csv.Error) as e:
        compressed = next((n for m, n in _MAGIC.items() if first.startswith(m)), None)
        if compressed == "gzip":
            hint = "It starts like a gzip file: name it *.gz."
        elif compressed:
            hint = f"It starts like a {compressed} file: decompress it, or gzip it (*.gz)."
        else:
            hint = "Is it a CSV file (optionally .gz), or a TFRecord file named *.tfrecord?"
        raise InputError(f"{flag}: cannot read {path} as CSV text ({e}). {hint}") from None
    if not header:
        raise InputError(f"{flag}: {path} is empty; a CSV file needs a header row and data rows.")
    names = tuple(h.strip() for h in header)
    if len(set(names)) != len(names) or "" in names:
        raise InputError(
            f"{flag}: the header of {path} has empty or repeated column names: {list(names)}."
        )
    return names


def _first_line(path: str) -> bytes:
    """The first line of a file (inflated if .gz), with its line end."""
    with tf.io.gfile.GFile(path, "rb") as raw:
        if not path.endswith(".gz"):
            return raw.readline()
        text = b""
        for piece in gzipped.inflate(raw, read_size=1 << 16, piece_size=1 << 16):
            text += piece
            if b"\n" in text:
                break
        return text.split(b"\n", 1)[0] + b"\n"


def _sniff_tfrecord(files: list[str], *, flag: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Feature names (sorted) and types, from the first records of the first files. A feature
    that first appears later is not seen (and not used)."""
    types: dict[str, str] = {}
    seen = 0
    for path in files:
        try:
            for record in tf.data.TFRecordDataset(path, Source.compression(path)).take(
                _SNIFF_RECORDS - seen
            ):
                example = tf.train.Example.FromString(record.numpy())
                for name, feature in example.features.feature.items():
                    kind = feature.WhichOneof("kind")
                    if kind is None:
                        continue
                    if types.setdefault(name, kind) != kind:
                        raise InputError(
                            f"{flag}: feature '{name}' is a {types[name]} in some "
                            f"records and a {kind} in others ({path}); give each "
                            "feature one type."
                        )
                seen += 1
        except InputError:
            raise
        except Exception as e:  # a corrupt file raises OpError, a corrupt record DecodeError
            raise InputError(
                f"{flag}: cannot read {path} as TFRecord files of tf.Example "
                f"({type(e).__name__}: {e})."
            ) from None
        if seen >= _SNIFF_RECORDS:
            break
    if not types:
        raise InputError(f"{flag}: {', '.join(files[:3])} hold no tf.Example with features.")
    names = tuple(sorted(types))
    return names, tuple(types[n] for n in names)


# Vertex AI managed datasets: AIP_DATA_FORMAT, and the scheme its URIs have.
MANAGED_FORMATS = {"bigquery": "bq://", "csv": "gs://", "jsonl": "gs://"}


def managed_dataset(
    data_format: str | None, *, training: str, validation: str | None
) -> tuple[str, str | None]:
    """(train data, eval data) of a Vertex AI managed dataset, from the URIs Vertex passes
    (`AIP_TRAINING_DATA_URI`, `AIP_VALIDATION_DATA_URI`): a table, or gs:// wildcards of CSV
    or JSON Lines files (`jsonl`: read with `open_source(jsonl=True)`, whatever the files'
    names). Fails naming an unknown `AIP_DATA_FORMAT`, or a URI of another kind than the
    format."""
    fmt = (data_format or "").strip().lower()
    if fmt not in MANAGED_FORMATS:
        raise InputError(
            f"AIP_DATA_FORMAT={data_format!r} is not a managed dataset format this trainer "
            f"knows ({', '.join(MANAGED_FORMATS)}); AIP_TRAINING_DATA_URI={training}."
        )
    for name, uri in (("AIP_TRAINING_DATA_URI", training), ("AIP_VALIDATION_DATA_URI", validation)):
        if uri and not uri.strip().startswith(MANAGED_FORMATS[fmt]):
            raise InputError(
                f"{name}={uri} does not start with {MANAGED_FORMATS[fmt]}, as "
                f"AIP_DATA_FORMAT={fmt} data must."
            )
    return training, validation
