"""Parquet input: files named *.parquet, *.parq or *.pq, local, `gs://` or `/gcs/`, read with
pyarrow one row group at a time (a file is never read whole into memory).

Every file of one input must have the same columns, in the same order (their types may
differ: the values are read as text). A row's number counts rows from 1 in each file. Each
record batch becomes CSV lines (pyarrow's CSV writer, no Python per row) that the CSV row
parser reads, so the scan, sharding (whole files, or every n-th row of each), bad rows (named
by file and row), caching and weights are the CSV input's. Column kinds follow the types:
  - integers, floats and decimals are numbers;
  - timestamps and dates are date columns (`trainer/input/dates.py`): written as ISO text
    (a timestamp with a zone in UTC, `...Z`), which serving takes too, and encoded as seconds,
    year, month, day, weekday and time of day;
  - times of day and durations are numbers: seconds (since midnight);
  - strings, booleans ("true"/"false") and dictionary-encoded columns are categorical (unless
    `--numeric_columns` names them: then text that is not a number is a bad row);
  - lists, structs, maps and binary values cannot be read: a used column of such a type in
    the training data stops the job before any work (ignore it with `--ignore_columns`), and
    a value of such a type met later (eval data, a file whose type differs) is a bad row
    where its column is used, as JSON Lines' nested values are.
A file that is not whole Parquet (cut short by an interrupted copy: its footer is lost) stops
the job when it is opened, naming it; a row group that cannot be read is a lost tail, as a
cut .gz file's (`blocks.LostTail`: an error naming the file, or its whole rows with
`--bad_rows=skip`).

A parameter-server worker's dataset cannot run pyarrow: there the chief converts the files
once into CSV shards (`trainer/input/formats/shards.py`), with the same values and kinds.
"""

from __future__ import annotations

import concurrent.futures
import io

import tensorflow as tf

from trainer.errors import InputError
from trainer.input import blocks
from trainer.input.formats import shards
from trainer.input.formats.base import (
    NESTED,
    Format,
    Reading,
    Source,
    iso_text,
    with_typed_categorical,
    with_typed_dates,
)
from trainer.input.options import InputOptions
from trainer.input.schema import ColumnChoices

# Rows converted at a time (at most; a row group's last batch has fewer).
BATCH_ROWS = 65_536
# Footers are read in parallel: on Cloud Storage each one is a round trip.
_OPEN_THREADS = 16
# A column's kind by its types (`Source.state`): categorical, or "" (sampled, as CSV text);
# a type the trainer cannot read is named.
CATEGORICAL = "categorical"
DATE = "date"
_SECONDS = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}


class Parquet(Format):
    name = "parquet"
    title = "Parquet"
    suffixes = (".parquet", ".parq", ".pq")
    unit = "row"
    reads_as = "Parquet files"
    in_graph = False
    nested_values = True

    def open(self, pattern, files, *, flag, options: InputOptions, recorded=None) -> Source:
        """Fails naming a file that is not whole Parquet, or whose columns differ from the
        first file's."""
        with concurrent.futures.ThreadPoolExecutor(min(_OPEN_THREADS, len(files))) as pool:
            schemas = list(pool.map(lambda f: _schema(f, flag=flag), files))
        names = tuple(schemas[0].names)
        for path, schema in zip(files, schemas):
            if tuple(schema.names) != names:
                raise InputError(
                    f"{flag}: {path} has columns {schema.names}, but {files[0]} has "
                    f"{list(names)}. All files of one input need the same columns, in the "
                    "same order."
                )
        if not names:
            raise InputError(f"{flag}: {files[0]} has no columns.")
        kinds = tuple(_merged([_kind(s.field(n).type) for s in schemas]) for n in names)
        return Source(flag, pattern, tuple(files), self, names, state=kinds)

    def column_choices(self, source: Source, choices: ColumnChoices) -> ColumnChoices:
        kinds = dict(zip(source.columns, source.state))
        unusable = {
            n: k
            for n, k in kinds.items()
            if k not in ("", CATEGORICAL, DATE) and n not in choices.ignore
        }
        if unusable:
            listed = ", ".join(f"{n} ({k})" for n, k in unusable.items())
            raise InputError(
                f"{source.flag}: column(s) {listed} of {source.pattern} hold values the trainer "
                "cannot read (it reads numbers, strings, booleans, timestamps and dates). Pass "
                f"--ignore_columns={','.join(unusable)}, or flatten them."
            )
        choices = with_typed_dates(choices, (n for n, k in kinds.items() if k == DATE))
        return with_typed_categorical(choices, (n for n, k in kinds.items() if k == CATEGORICAL))

    def reader(self, source: Source, reading: Reading):
        def chunks(path: str):
            yield from csv_chunks(path, lost_tails=reading.lost_tails, notes=reading.notes)

        return blocks.python_blocks(chunks), False

    # -- parameter-server clusters ----------------------------------------------------------
    def stage(self, source: Source, *, folder: str, name: str) -> Source:
        def lines(path: str):
            return (text for text, _ in csv_chunks(path))

        manifest = shards.stage_files(
            self, source, lines, folder=folder, name=name, extra={"kinds": list(source.state)}
        )
        return self.open_staged(source.pattern, flag=source.flag, options=None, manifest=manifest)

    def reuse_staged(self, pattern, files, *, flag, options, folder, name) -> Source | None:
        return shards.reuse_files(
            self, pattern, files, flag=flag, options=options, folder=folder, name=name
        )

    def open_staged(self, pattern, *, flag, options, manifest) -> Source:
        state = tuple(manifest["kinds"])
        return shards.open_files(self, pattern, flag=flag, manifest=manifest, state=state)


PARQUET = Parquet()


def _parquet_file(path: str):
    """`path` open as a pyarrow ParquetFile: local files (and /gcs/ mounts) by pyarrow,
    others (gs://) through tf.io.gfile, as the other formats read them."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path if "://" not in path else _GFile(path))


class _GFile(io.RawIOBase):
    """A tf.io.gfile file as the seekable binary file pyarrow reads."""

    def __init__(self, path: str):
        self._file = tf.io.gfile.GFile(path, "rb")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def _schema(path: str, *, flag: str):
    """The Arrow schema in the footer of one file."""
    import pyarrow as pa

    try:
        with _parquet_file(path) as f:
            return f.schema_arrow
    except (tf.errors.OpError, OSError, pa.ArrowException) as e:
        raise InputError(
            f"{flag}: cannot read {path} as a Parquet file ({getattr(e, 'message', e)}). Is it "
            "whole (not cut short by an interrupted copy or writer)? Write it again, or leave "
            "it out."
        ) from None


def _kind(kind) -> str:
    """A column's kind by its Arrow type: CATEGORICAL, "" (read as numbers or text), or the
    type, which the trainer cannot read."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_boolean(kind):
        return CATEGORICAL
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return DATE
    if (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_temporal(kind)
        or pa.types.is_null(kind)
    ):
        return ""
    return str(kind)


def _merged(kinds: list[str]) -> str:
    """One column's kind over every file: a type the trainer cannot read wherever met,
    categorical (or dates) only where every file's type is text (or a date or timestamp);
    else the scan decides from the values."""
    unusable = [k for k in kinds if k not in ("", CATEGORICAL, DATE)]
    if unusable:
        return unusable[0]
    for kind in (CATEGORICAL, DATE):
        if all(k == kind for k in kinds):
            return kind
    return ""


def csv_chunks(path: str, *, lost_tails: bool = False, notes: blocks.Notes | None = None):
    """(CSV lines of a record batch, the number of its first row) of one file, the columns in
    order, `BATCH_ROWS` rows at most, one row group at a time. A row group that cannot be
    read ends the file: `blocks.TruncatedInput`, or with `lost_tails` the end of its rows
    (`notes` records where)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    options = pa_csv.WriteOptions(include_header=False)
    row = 1
    with _parquet_file(path) as f:
        try:
            for batch in f.iter_batches(batch_size=BATCH_ROWS, use_threads=False):
                if not batch.num_rows:
                    continue
                columns = [_readable(array) for array in batch.columns]
                sink = io.BytesIO()
                pa_csv.write_csv(
                    pa.RecordBatch.from_arrays(columns, names=batch.schema.names), sink, options
                )
                yield sink.getvalue().removesuffix(b"\n"), row
                row += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            tail = blocks.LostTail(path, row - 1, f"is not whole Parquet ({e})")
            if notes is not None:
                notes.lost[path] = tail
            if not lost_tails:
                raise blocks.TruncatedInput(tail) from None


def _readable(array):
    """A column of a record batch as the CSV writer should write it: numbers, text on one
    line, booleans; timestamps and dates as ISO text; times of day and durations as seconds;
    other types as a `NESTED` mark."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_dictionary(kind):
        array, kind = array.dictionary_decode(), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.replace_substring_regex(array, r"[\r\n]", " ")  # one row per line
    if pa.types.is_decimal(kind):
        return pc.cast(array, pa.float64())
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return iso_text(array)
    if pa.types.is_temporal(kind):  # times of day, durations: a count of units
        count = pc.cast(array, pa.int64() if kind.bit_width == 64 else pa.int32())
        return pc.divide(pc.cast(count, pa.float64()), _SECONDS[kind.unit])
    if pa.types.is_floating(kind) and kind.bit_width == 16:
        return pc.cast(array, pa.float32())
    if (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_null(kind)
    ):
        return array
    mark = pa.scalar(f"{NESTED}{kind}")
    return pc.if_else(pc.is_valid(array), mark, pa.scalar(None, pa.string()))
