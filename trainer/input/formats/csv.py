"""CSV input: files with a header row (optionally .gz), the format of any file no other format
claims by its name.

Every file of one input must have the same header. Read in this process, a file comes in
chunks of about `blocks.CHUNK_BYTES`, decompressed and cut at the last line end in Python and
split into lines by TensorFlow: 3x less CPU than `TextLineDataset`, which pays for every line
(1M census lines: 0.96 against 2.6 CPU seconds). A dataset that runs elsewhere (a
parameter-server worker's, built from a function the chief traces) cannot call back into
Python: it reads with TextLineDataset, up to the last whole line of a file the statistics pass
found cut short.
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
from collections.abc import Sequence

import tensorflow as tf

from trainer.errors import InputError
from trainer.input import blocks, gzipped
from trainer.input.formats.base import Format, Reading, Source
from trainer.input.options import InputOptions

# Headers are read in parallel: on Cloud Storage each one is a round trip.
_HEADER_THREADS = 16
# A header row is read whole up to this; a longer first line is no header (a file without
# line ends, binary data).
FIRST_LINE_LIMIT = 4 << 20
# What the first bytes of a file that is not CSV text say it is.
_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "Zstandard",
    b"PK\x03\x04": "zip",
}


class Csv(Format):
    name = "csv"
    title = "CSV"

    def matches(self, path: str) -> bool:
        return True  # the registry tries it last

    def open(self, pattern, files, *, flag, options: InputOptions, recorded=None) -> Source:
        """Fails naming a file whose header differs from the first file's."""
        with concurrent.futures.ThreadPoolExecutor(min(_HEADER_THREADS, len(files))) as pool:
            headers = list(pool.map(lambda f: csv_header(f, flag=flag), files))
        for path, header in zip(files, headers):
            if header != headers[0]:
                raise InputError(
                    f"{flag}: {path} has columns {list(header)}, but {files[0]} has "
                    f"{list(headers[0])}. All files of one input need the same "
                    "columns, in the same order."
                )
        return Source(flag, pattern, tuple(files), self, headers[0])

    def reader(self, source: Source, reading: Reading):
        if reading.in_process:
            # The chunks are cut under the GIL: one file at a time reads fastest.
            def chunks(path: str):
                yield from blocks.line_chunks(
                    path, lost_tails=reading.lost_tails, notes=reading.notes
                )

            return blocks.python_blocks(chunks, header=True), True
        return _line_blocks(reading.last_lines), False


CSV = Csv()


def _line_blocks(last_lines: Sequence[int | None] | None):
    """fn(index, path) -> blocks of a CSV file read by TensorFlow's TextLineDataset, up to
    line `last_lines[index]` (all lines where None)."""
    limits = (
        None
        if last_lines is None
        else tf.constant([-1 if n is None else n for n in last_lines], tf.int64)
    )

    def one_file(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
        lines = tf.data.TextLineDataset(
            path, blocks.compression(path), buffer_size=blocks.READ_BUFFER_BYTES
        )
        # Line 1 is the header; blocks are full but for the last, so block i starts at line
        # 2 + i * READ_BLOCK_ROWS.
        located = (
            lines.skip(1)
            .batch(blocks.READ_BLOCK_ROWS)
            .enumerate()
            .map(lambda i, text: blocks.located(index, i * blocks.READ_BLOCK_ROWS + 2, text))
        )
        if limits is None:
            return located

        def cut(file, line, text):
            keep = (limits[index] < 0) | (line <= limits[index])
            return tuple(tf.boolean_mask(t, keep) for t in (file, line, text))

        return located.map(cut)

    return one_file


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
    _check_text(path, first, flag=flag)
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


def _check_text(path: str, first: bytes, *, flag: str) -> None:
    """InputError in one line for a first line that no CSV reader could take: an archive (tar,
    gzipped or not), binary data (NUL bytes), lines ended by a carriage return alone, or no
    line end within `FIRST_LINE_LIMIT` bytes."""
    if first[257:262] == b"ustar":
        member = first[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        raise InputError(
            f"{flag}: {path} is a tar archive (its first member: {member!r}); extract it and "
            "give the CSV files (optionally .gz) themselves."
        )
    compressed = any(first.startswith(magic) for magic in _MAGIC)  # named by the caller
    if b"\0" in first and not compressed:
        raise InputError(
            f"{flag}: cannot read {path} as CSV text: its first line holds NUL bytes (binary "
            "data). Is it a CSV file (optionally .gz), or a TFRecord file named *.tfrecord?"
        )
    if b"\r" in first.rstrip(b"\r\n"):
        raise InputError(
            f"{flag}: {path} ends its lines with a carriage return alone (CR, as 'CSV "
            "(Macintosh)' exports do); the reader takes LF or CRLF line ends. Convert it "
            "(tr '\\r' '\\n' < in.csv > out.csv) or save it as 'CSV UTF-8'."
        )
    if not first.endswith(b"\n") and len(first) >= FIRST_LINE_LIMIT:
        raise InputError(
            f"{flag}: the first line of {path} is longer than {FIRST_LINE_LIMIT >> 20} MB: not "
            "a CSV header row. Is it a CSV file (optionally .gz)?"
        )


def _first_line(path: str) -> bytes:
    """The first line of a file (inflated if .gz), with its line end; at most
    `FIRST_LINE_LIMIT` bytes of it (a file without line ends is not read whole)."""
    with tf.io.gfile.GFile(path, "rb") as raw:
        if path.endswith(".gz"):
            pieces = gzipped.inflate(raw, read_size=1 << 16, piece_size=1 << 16)
        else:
            pieces = iter(lambda: raw.read(1 << 16), b"")
        text = b""
        for piece in pieces:
            text += piece
            if b"\n" in text or len(text) >= FIRST_LINE_LIMIT:
                break
        line, newline, _ = text.partition(b"\n")
        return line[:FIRST_LINE_LIMIT] + newline
