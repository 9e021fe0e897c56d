"""JSON Lines input: files named *.jsonl, *.ndjson (optionally .gz), or any file when a Vertex
AI managed dataset says `AIP_DATA_FORMAT=jsonl`. One JSON object per line; its keys are the
columns, its values numbers, strings, booleans or null (a missing value, as is an absent key).

A JSON Lines file is read as CSV: each chunk of lines (`blocks.line_chunks`) becomes as many
CSV lines, the columns in one order, that the CSV row parser reads, so the scan, sharding,
bad rows (with file and line: line 1 is the first object, there is no header), caching and
weights are the CSV input's. A chunk is converted by pyarrow's JSON reader and CSV writer
(no Python per row: 100,000 census-like rows, 16 MB, in 0.13 CPU seconds against 0.74 s with
the json module); a chunk pyarrow does not read as flat columns of numbers, strings and
booleans (a blank line, a value that is not JSON, a nested value, a key that is not a column,
a column with numbers and strings, text pyarrow would read as a timestamp) is converted line
by line with the json module instead, where each such line is placed.

The columns are the keys of the first `SNIFF_LINES` lines of every file, in the order they
first appear. A line with another key is a bad row (it names the key), as is a line that is
not a JSON object. A nested value (object or array) is a bad row where its column is used;
an ignored column (`--ignore_columns`) may hold anything.

A parameter-server worker's dataset cannot convert lines: there the chief converts the files
once, the same way, into CSV shards `folder/name-<file>-<part>.csv.gz` (each file's lines in
order, so shard line n + 1 is the file's line n under the header), the manifest last
(`trainer/input/formats/shards.py`). A converted bad line is still described as a JSON one.
"""

from __future__ import annotations

import concurrent.futures
import io
import json

import tensorflow as tf

from trainer.errors import InputError
from trainer.input import blocks
from trainer.input.formats import shards
from trainer.input.formats.base import NESTED, Format, Reading, Source, bad_line
from trainer.input.options import InputOptions

SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
# Lines of each file whose keys make the columns.
SNIFF_LINES = 1000
_SNIFF_THREADS = 16


class JsonLines(Format):
    name = "jsonl"
    title = "JSON Lines"
    suffixes = SUFFIXES
    in_graph = False
    nested_values = True
    converted = True

    def open(self, pattern, files, *, flag, options: InputOptions, recorded=None) -> Source:
        return Source(flag, pattern, tuple(files), self, sniff_columns(list(files), flag=flag))

    def reader(self, source: Source, reading: Reading):
        def chunks(path: str):
            yield from csv_chunks(
                path, source.columns, lost_tails=reading.lost_tails, notes=reading.notes
            )

        # One file at a time, as CSV chunks (the json fallback holds the GIL).
        return blocks.python_blocks(chunks), True

    # -- parameter-server clusters ----------------------------------------------------------
    def stage(self, source: Source, *, folder: str, name: str) -> Source:
        def lines(path: str):
            return (text for text, _ in csv_chunks(path, source.columns))

        manifest = shards.stage_files(self, source, lines, folder=folder, name=name)
        return shards.open_files(self, source.pattern, flag=source.flag, manifest=manifest)

    def reuse_staged(self, pattern, files, *, flag, options, folder, name) -> Source | None:
        return shards.reuse_files(
            self, pattern, files, flag=flag, options=options, folder=folder, name=name
        )

    def open_staged(self, pattern, *, flag, options, manifest) -> Source:
        return shards.open_files(self, pattern, flag=flag, manifest=manifest)


JSONL = JsonLines()


# -- columns ----------------------------------------------------------------------------------
def sniff_columns(files: list[str], *, flag: str) -> tuple[str, ...]:
    """The keys of the first `SNIFF_LINES` lines of each file, in the order they first appear
    (files in order). Lines that are not JSON objects are passed over here (the scan names
    them)."""
    with concurrent.futures.ThreadPoolExecutor(min(_SNIFF_THREADS, len(files))) as pool:
        keys = list(pool.map(lambda f: _first_keys(f, flag=flag), files))
    names = dict.fromkeys(k for file_keys in keys for k in file_keys)
    if not names:
        raise InputError(
            f"{flag}: the first {SNIFF_LINES} lines of {', '.join(files[:3])} hold no JSON "
            "object with a key. JSON Lines input needs one object per line, e.g. "
            '{"age": 39, "job": "clerk", "label": 1}.'
        )
    return tuple(names)


def _first_keys(path: str, *, flag: str) -> dict[str, None]:
    keys: dict[str, None] = {}
    lines: list[bytes] = []
    try:  # (a file cut short is the statistics pass's to report: its whole lines are read)
        for chunk, _ in blocks.line_chunks(path, lost_tails=True):
            lines += chunk.split(b"\n")
            if len(lines) >= SNIFF_LINES:
                break
    except (tf.errors.OpError, OSError) as e:
        raise InputError(f"{flag}: cannot read {path}: {getattr(e, 'message', e)}") from None
    if lines:
        lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")
    for line in lines[:SNIFF_LINES]:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
            continue
        if isinstance(row, dict):
            keys.update(dict.fromkeys(row))
    return keys


# -- lines as CSV -----------------------------------------------------------------------------
def csv_chunks(
    path: bytes | str,
    columns: tuple[str, ...],
    *,
    lost_tails: bool = False,
    notes: blocks.Notes | None = None,
):
    """(CSV lines of a chunk of the file's lines, the number of its first line), for
    `blocks.blocks`: as many CSV lines as JSON lines, in the order of `columns`. A file cut
    short, `notes`: as `blocks.line_chunks`."""
    for text, first_line in blocks.line_chunks(path, lost_tails=lost_tails, notes=notes):
        if first_line == 1:
            text = text.removeprefix(b"\xef\xbb\xbf")
        yield to_csv(text, columns), first_line


def to_csv(text: bytes, columns: tuple[str, ...]) -> bytes:
    """JSON lines (without the last line end) as CSV lines, one for one."""
    converted = _arrow_csv(text, columns)
    if converted is None:
        index = {name: i for i, name in enumerate(columns)}
        converted = b"\n".join(_csv_line(line, columns, index) for line in text.split(b"\n"))
    return converted


def _arrow_csv(text: bytes, columns: tuple[str, ...]) -> bytes | None:
    """The lines converted by pyarrow, or None where a line needs the json module."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv
    import pyarrow.json as pa_json

    try:
        table = pa_json.read_json(
            io.BytesIO(text),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(text) + 1),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != text.count(b"\n") + 1 or not set(table.column_names) <= set(columns):
        return None  # blank lines (pyarrow skips them), or a key that is not a column
    arrays = []
    for name in columns:
        if name not in table.column_names:
            arrays.append(pa.nulls(table.num_rows, pa.string()))
            continue
        array = table.column(name)
        kind = array.type
        if pa.types.is_string(kind):  # one row per line
            array = pc.replace_substring_regex(array, r"[\r\n]", " ")
        elif not (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_null(kind)
        ):
            return None  # nested values, or strings read as timestamps
        arrays.append(array)
    sink = io.BytesIO()
    pa_csv.write_csv(
        pa.Table.from_arrays(arrays, names=list(columns)),
        sink,
        pa_csv.WriteOptions(include_header=False),
    )
    return sink.getvalue().removesuffix(b"\n")


def _csv_line(line: bytes, columns: tuple[str, ...], index: dict[str, int]) -> bytes:
    if not line.strip():
        return b""
    try:
        row = json.loads(line)
    except ValueError as e:  # (Python's own advice after a ";" is not the user's to follow)
        return bad_line(f"is not JSON ({str(e).split(';')[0]}): fix that line")
    except RecursionError:
        return bad_line("nests arrays or objects too deeply to be read: fix that line")
    if not isinstance(row, dict):
        return bad_line(f"holds a JSON {type(row).__name__}, not an object with a key per column")
    fields = [""] * len(columns)
    for key, value in row.items():
        at = index.get(key)
        if at is None:
            shown = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "")
            return bad_line(
                f"has key {key!r}, which is not a column: the columns are the keys of the "
                f"first {SNIFF_LINES} lines of each file ({shown}). Give the key in those "
                "lines, or leave it out"
            )
        fields[at] = _field(value)
    try:
        return ",".join(fields).encode()
    except UnicodeEncodeError:  # "\ud800" in JSON: a lone surrogate, no character at all
        return bad_line(
            "holds a string with a lone surrogate escape (\\ud800 to \\udfff): fix that line"
        )


def _field(value) -> str:
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        text = value.replace("\r", " ").replace("\n", " ")
    else:  # an object or an array: a bad row where the column is used
        text = NESTED + json.dumps(value, separators=(",", ":")).replace("\n", " ")[:200]
    if any(c in text for c in ',"'):
        return '"' + text.replace('"', '""') + '"'
    return text
