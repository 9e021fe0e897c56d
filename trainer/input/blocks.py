"""Files read as blocks of rows, in TensorFlow (`trainer/input/rows.py` parses them): the
readers the input formats share (each format picks its own: `trainer/input/formats/`).

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
from collections.abc import Callable, Iterator

import tensorflow as tf

from trainer.errors import InputError
from trainer.input.gzipped import Cut, inflate

# TFRecord and TextLineDataset rows are read in blocks of this many.
READ_BLOCK_ROWS = 1024
READ_BUFFER_BYTES = 1 << 20


def python_blocks(chunks: Callable[[str], Iterator[tuple[bytes, int]]], *, header: bool = False):
    """fn(index, path) -> blocks of the lines `chunks(path)` yields as (text of whole lines
    without the last line end, the number of its first line), read in Python (a format
    whose rows are converted there; CSV read in chunks); with `header`, line 1 is left
    out."""

    def generate(path: bytes):
        yield from chunks(path.decode())

    def one_file(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
        data = tf.data.Dataset.from_generator(
            generate,
            args=(path,),
            output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64)),
        )

        def split(chunk, first_line):
            lines = tf.strings.split(chunk, "\n")
            if not header:
                return located(index, first_line, lines)
            numbers = first_line + tf.range(tf.size(lines, out_type=tf.int64))
            data = numbers > 1  # not the header
            return located(index, tf.boolean_mask(numbers, data), tf.boolean_mask(lines, data))

        return data.map(split)

    return one_file


def located(index, first_line, text):
    """`(file, line, text)`: `first_line` is the first row's number, or every row's."""
    size = tf.size(text, out_type=tf.int64)
    line = first_line + tf.range(size) if first_line.shape.rank == 0 else first_line
    return tf.fill([size], tf.cast(index, tf.int64)), line, text


def compression(path: tf.Tensor) -> tf.Tensor:
    """TensorFlow's compression of a file named `path`: "GZIP" for *.gz."""
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
