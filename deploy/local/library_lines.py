"""Which lines of a replica's output are TensorFlow's own log, not the trainer's.

A successful local cluster run printed about 60% such lines: gRPC's error blocks as replicas
close their connections at the end, the eager service's session options dumped as a protocol
buffer, "Started server" info lines, all through TensorFlow's C++ logging (and absl's, which
ignores TF_CPP_MIN_LOG_LEVEL before absl::InitializeLog). The launcher keeps them in a file
instead of the console (`deploy.launch`); `LibraryLines` tells them apart,
one process's lines in order, a block at a time.
"""

from __future__ import annotations

import re

# A line's start, as each logger writes it.
_STARTS = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] "  # TensorFlow's C++ logging
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "  # absl's C++ logging (and gRPC's)
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|(?:INFO|WARNING):tensorflow:"  # Python's logging echoing TensorFlow's absl lines
)
# A protocol buffer's next field, in a message dumped over several lines ("gpu_options {",
# "allow_soft_placement: true").
_PROTO_FIELD = re.compile(r"[a-z_]+(?: \{|: \S.*)$")
# gRPC's error details, on lines of their own after its error line.
_GRPC_MORE = re.compile(
    r"Additional GRPC error information|:\{\"created\"|This could happen if the remote target"
)


class LibraryLines:
    """Classifies one process's output lines, in order: `is_library(line)` is True for a line
    of TensorFlow's (or gRPC's, absl's) own logging and for the lines that carry on its
    block: a message's indented or braced continuation (a protocol buffer dumped over several
    lines), gRPC's error details, and the blank line that closes a block."""

    def __init__(self) -> None:
        self._depth = 0  # open braces of a multi-line message
        self._in_block = False  # the line before was a library line

    def is_library(self, line: str) -> bool:
        if _STARTS.match(line) or _GRPC_MORE.match(line):
            self._in_block = True
            self._depth = max(0, line.count("{") - line.count("}"))
            return True
        if self._in_block and (
            self._depth > 0 or line[:1].isspace() or not line.strip() or _PROTO_FIELD.match(line)
        ):
            self._depth = max(0, self._depth + line.count("{") - line.count("}"))
            return True
        self._in_block = False
        self._depth = 0
        return False
