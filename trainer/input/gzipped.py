"""Gzip files inflated in pieces, never read as if whole when they are not: the one inflater of
the trainer's readers (`blocks.line_chunks`, CSV headers) and of `deploy` (which must take and
refuse what training does). No TensorFlow here: it works on any object with `read(size)`.

TensorFlow's own gzip reader returns what it could inflate from a file cut short (an
interrupted copy or writer) without a word, and reads its partial last line as a row. Here a
stream that stops before its end-of-stream marker, or that zlib cannot inflate (corrupt, its
CRC-32 or size wrong), raises `Cut` after every byte before the cut. A file may hold several
gzip members one after another (as `gzip` writes with append), and zero bytes after a member
are padding, as `gzip` reads them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

_WBITS = zlib.MAX_WBITS | 16  # a gzip header and trailer around the deflate stream


class Cut(Exception):
    """The stream stops being a whole gzip stream here; the message says how ("ends before
    its gzip stream does", "is not a whole gzip stream (zlib's reason)")."""


def inflate(f, *, read_size: int = 1 << 20, piece_size: int = 1 << 20) -> Iterator[bytes]:
    """The inflated bytes of the gzip file open as `f`, in pieces of at most `piece_size`,
    reading `read_size` compressed bytes at a time. Raises `Cut` where it stops being whole
    (after yielding every byte before that)."""
    inflater, started, first = zlib.decompressobj(wbits=_WBITS), False, True
    try:
        while raw := f.read(read_size):
            while raw:
                if not started and not first:  # between members: padding, then the next
                    raw = raw.lstrip(b"\0")
                    if not raw:
                        break
                started = True
                yield inflater.decompress(raw, piece_size)
                raw = inflater.unconsumed_tail
                if inflater.eof:  # this member is whole; another may follow
                    raw = inflater.unused_data + raw
                    inflater, started, first = zlib.decompressobj(wbits=_WBITS), False, False
        if started:
            yield inflater.flush()
    except zlib.error as e:
        raise Cut(f"is not a whole gzip stream ({e})") from None
    if started and not inflater.eof:
        raise Cut("ends before its gzip stream does")
