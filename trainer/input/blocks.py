"""Files read as blocks of rows, in TensorFlow (`trainer/input/rows.py` parses them).

A block is `(file, line, text)`: the index of its file in the `Source`, the line (CSV, the
header being line 1; JSON Lines) or record (TFRecord) number of each row, and the row's text
(a CSV line, a JSON line converted to one, or a serialized tf.Example). Keeping where each
row came from costs two integers per row and lets every error name a file and a line.

A compressed file that ends before its compressed stream does (cut short by an interrupted
copy or writer) or whose stream is corrupt is never read as if whole: TensorFlow's own gzip
reader returns what it could inflate without a word (a truncated `.csv.gz` read as half of its
rows, the last one a fragment). Files read here in Python (`line_chunks`) are checked as they
are inflated; the last, partial line is never a row. By default that raises `TruncatedInput`;
a pass that skips bad rows (`lost_tails=True`) keeps the whole lines before the cut, and a
caller that asks (`Notes`, the statistics pass) learns which files were cut where, and each
whole file's CRC-32. TensorFlow's own readers cannot check: compressed TFRecord files are
checked whole by `check_compressed` first, and a parameter-server worker's TextLineDataset
stops each file at the last whole line the statistics pass found (`last_lines`).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import tensorflow as tf

from trainer.errors import InputError
from trainer.input import files as files_lib
from trainer.input.files import Source
from trainer.input.gzipped import Cut, inflate

# TFRecord and TextLineDataset rows are read in blocks of this many.
READ_BLOCK_ROWS = 1024
_READ_BUFFER_BYTES = 1 << 20


def blocks(
    source: Source,
    files: tf.data.Dataset,
    *,
    parallel: int,
    deterministic: bool,
    in_process: bool = True,
    cycle: int | None = None,
    lost_tails: bool = False,
    notes: Notes | None = None,
    last_lines: Sequence[int | None] | None = None,
) -> tf.data.Dataset:
    """Blocks `(file, line, text)` of the files that `files` yields as `(index, path)`,
    `parallel` files read at once (CSV headers left out), blocks of `cycle` files (default:
    `parallel`) taken in turn.

    CSV read `in_process` comes in chunks of about `CHUNK_BYTES`, decompressed and cut at the
    last line end in Python and split into lines by TensorFlow: 3x less CPU than
    `TextLineDataset`, which pays for every line (1M census lines: 0.96 against 2.6 CPU
    seconds). A dataset that runs elsewhere (a parameter-server worker's, built from a
    function the chief traces) cannot call back into Python: it reads with TextLineDataset.

    A file read in Python that is cut short raises `TruncatedInput`, or with `lost_tails`
    yields its whole lines; `notes` records the cuts and checksums (see `line_chunks`).
    `last_lines`: the last line to read of each file of the source (None: all), for
    TensorFlow's line reader, which cannot tell a cut file (the module doc).
    """
    if source.format == files_lib.TFRECORD:
        one_file = _record_blocks
    elif source.format == files_lib.BIGQUERY:
        if not in_process:
            raise InputError(
                f"{source.flag}={source.pattern}: a BigQuery table is read in Python, which a "
                "parameter-server worker's dataset cannot call (a ps cluster's chief stages the "
                "table as files first: trainer/input/staging.py)."
            )
        from trainer.input import bigquery  # the Google client libraries, only when used

        one_file = bigquery.stream_blocks(source)
    elif source.format == files_lib.JSONL:
        if not in_process:
            raise InputError(
                f"{source.flag}={source.pattern}: JSON Lines files are converted in Python, "
                "which a parameter-server worker's dataset cannot call."
            )
        one_file = _jsonl_blocks(source.columns, lost_tails, notes)
        parallel = 1  # one file at a time, as CSV chunks (the json fallback holds the GIL)
    elif in_process:
        one_file = _chunk_blocks(lost_tails, notes)
        parallel = 1  # the chunks are cut under the GIL: one file at a time reads fastest
    else:
        one_file = _line_blocks(last_lines)
    cycle = max(cycle or parallel, parallel)
    if parallel == 1:  # one thread takes the files' blocks in turn
        return files.interleave(one_file, cycle_length=cycle)
    return files.interleave(
        one_file, cycle_length=cycle, num_parallel_calls=parallel, deterministic=deterministic
    )


def _record_blocks(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
    records = tf.data.TFRecordDataset(path, _compression(path), buffer_size=_READ_BUFFER_BYTES)
    return (
        records.batch(READ_BLOCK_ROWS)
        .enumerate()
        .map(lambda i, text: _located(index, i * READ_BLOCK_ROWS + 1, text))
    )


def _line_blocks(last_lines: Sequence[int | None] | None):
    """fn(index, path) -> blocks of a CSV file read by TensorFlow's TextLineDataset, up to
    line `last_lines[index]` (all lines where None)."""
    limits = (
        None
        if last_lines is None
        else tf.constant([-1 if n is None else n for n in last_lines], tf.int64)
    )

    def one_file(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
        lines = tf.data.TextLineDataset(path, _compression(path), buffer_size=_READ_BUFFER_BYTES)
        # Line 1 is the header; blocks are full but for the last, so block i starts at line
        # 2 + i * READ_BLOCK_ROWS.
        located = (
            lines.skip(1)
            .batch(READ_BLOCK_ROWS)
            .enumerate()
            .map(lambda i, text: _located(index, i * READ_BLOCK_ROWS + 2, text))
        )
        if limits is None:
            return located

        def cut(file, line, text):
            keep = (limits[index] < 0) | (line <= limits[index])
            return tuple(tf.boolean_mask(t, keep) for t in (file, line, text))

        return located.map(cut)

    return one_file


def _chunk_blocks(lost_tails: bool, notes: Notes | None):
    """fn(index, path) -> blocks of a CSV file read by `line_chunks`."""

    def chunks(path: bytes):
        yield from line_chunks(path, lost_tails=lost_tails, notes=notes)

    def one_file(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
        data = tf.data.Dataset.from_generator(
            chunks,
            args=(path,),
            output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64)),
        )

        def split(chunk, first_line):
            lines = tf.strings.split(chunk, "\n")
            numbers = first_line + tf.range(tf.size(lines, out_type=tf.int64))
            data = numbers > 1  # not the header
            return _located(index, tf.boolean_mask(numbers, data), tf.boolean_mask(lines, data))

        return data.map(split)

    return one_file


def _jsonl_blocks(columns: tuple[str, ...], lost_tails: bool, notes: Notes | None):
    """fn(index, path) -> blocks of a JSON Lines file, each line converted to a CSV line
    (`jsonl.csv_chunks`); line 1 is the first object."""
    from trainer.input import jsonl

    def chunks(path: bytes):
        yield from jsonl.csv_chunks(path, columns, lost_tails=lost_tails, notes=notes)

    def one_file(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
        data = tf.data.Dataset.from_generator(
            chunks,
            args=(path,),
            output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64)),
        )
        return data.map(
            lambda chunk, first_line: _located(index, first_line, tf.strings.split(chunk, "\n"))
        )

    return one_file


def _located(index, first_line, text):
    """`(file, line, text)`: `first_line` is the first row's number, or every row's."""
    size = tf.size(text, out_type=tf.int64)
    line = first_line + tf.range(size) if first_line.shape.rank == 0 else first_line
    return tf.fill([size], tf.cast(index, tf.int64)), line, text


def _compression(path: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")


CHUNK_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class LostTail:
    """Where a compressed file stops being readable: after its line `lines` (its whole lines
    before the cut; the header is line 1 of a CSV file), and why."""

    path: str
    lines: int
    why: str

    def describe(self) -> str:
        return (
            f"{self.path} {self.why}: its first {self.lines:,} lines are whole, the rest "
            "of the file is lost (a copy or a writer that was interrupted?)"
        )


class TruncatedInput(InputError):
    """A compressed input file that ends before its compressed stream does, or is corrupt."""

    def __init__(self, tail: LostTail):
        super().__init__(
            f"{tail.describe()}. Copy or write the file again, or leave it out of the input."
        )
        self.tail = tail


@dataclasses.dataclass
class Notes:
    """What `line_chunks` found in the files it read for a caller that keeps it: the files
    cut short (`lost`, by path) and the CRC-32 of the bytes of each file read to its end
    (`checksums`: the statistics pass records them, so that a resume can tell a file whose
    modification time changed but not its contents, a package installed again, from a
    rewritten one)."""

    lost: dict[str, LostTail] = dataclasses.field(default_factory=dict)
    checksums: dict[str, int] = dataclasses.field(default_factory=dict)


def checksum(path: str) -> int:
    """The CRC-32 of the bytes of `path`, read through."""
    crc = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while data := f.read(CHUNK_BYTES):
            crc = zlib.crc32(data, crc)
    return crc


class _Summed:
    """A file's `read`, keeping the CRC-32 of what it read."""

    def __init__(self, f):
        self._f = f
        self.crc = 0

    def read(self, size: int) -> bytes:
        data = self._f.read(size)
        self.crc = zlib.crc32(data, self.crc)
        return data


def line_chunks(path: bytes | str, *, lost_tails: bool = False, notes: Notes | None = None):
    """(text of whole lines, the number of its first line) for a file, about `CHUNK_BYTES` of
    text at a time, decompressed if it ends in .gz (concatenated gzip members too); "\r\n"
    line ends become "\n".

    A .gz file cut short or corrupt raises `TruncatedInput` after the whole lines before the
    cut; with `lost_tails` it ends there instead. The partial line at the cut is never
    yielded. `notes` (if given) records the cut, or the CRC-32 of a file read to its end."""
    path = path.decode() if isinstance(path, bytes) else path
    line, pending = 1, b""
    with tf.io.gfile.GFile(path, "rb") as raw:
        f = _Summed(raw) if notes is not None else raw
        try:
            for data in _decompressed(f, gzipped=path.endswith(".gz")):
                pending += data
                if len(pending) < CHUNK_BYTES:
                    continue
                cut = pending.rfind(b"\n")
                if cut < 0:
                    continue
                text, pending = _lines(pending[: cut + 1]), pending[cut + 1 :]
                yield text, line
                line += text.count(b"\n") + 1
        except Cut as e:
            whole = pending[: pending.rfind(b"\n") + 1]
            if whole:
                text = _lines(whole)
                yield text, line
                line += text.count(b"\n") + 1
            tail = LostTail(path, line - 1, str(e))
            if notes is not None:
                notes.lost[path] = tail
            if not lost_tails:
                raise TruncatedInput(tail) from None
            return
    if isinstance(f, _Summed):
        assert notes is not None
        notes.checksums[path] = f.crc
    if pending:
        yield _lines(pending), line


def _lines(text: bytes) -> bytes:
    """Text without its last line end, "\r\n" line ends made "\n"."""
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").removesuffix(b"\r")
    return text.removesuffix(b"\n")


def _decompressed(f, *, gzipped: bool):
    """The bytes of an open file, in pieces of at most `CHUNK_BYTES` (inflated if `gzipped`:
    `trainer.input.gzipped.inflate`, which raises `Cut` where a gzip stream is cut short)."""
    if gzipped:
        yield from inflate(f, read_size=CHUNK_BYTES, piece_size=CHUNK_BYTES)
        return
    while data := f.read(CHUNK_BYTES):
        yield data


def check_compressed(path: str) -> str | None:
    """Why a .gz file is not a whole gzip stream (None: it is, or it is not .gz), read through
    once: for the files TensorFlow inflates itself (compressed TFRecord files), which it reads
    as if whole when a cut falls between two records."""
    if not path.endswith(".gz"):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        try:
            for _ in _decompressed(f, gzipped=True):
                pass
        except Cut as e:
            return f"{path} {e}"
    return None


def indexed_files(source: Source, files: Sequence[int] | None = None) -> tf.data.Dataset:
    """`(index, path)` of the source's files (or of those with the given indices)."""
    indices = list(range(len(source.files))) if files is None else list(files)
    return tf.data.Dataset.from_tensor_slices(
        (tf.constant(indices, tf.int64), tf.constant([source.files[i] for i in indices]))
    )
