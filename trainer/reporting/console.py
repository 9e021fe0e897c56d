"""What a user of `python -m trainer.task` sees: their own lines, not the libraries'.

By default the trainer keeps TensorFlow's C++ info and warning lines (oneDNN, CPU features)
and other packages' Python warnings (google-api-core's FutureWarning about the Python version)
out of the output, and prints its own lines without absl's prefixes: a progress bar while an
iteration trains when stderr is a terminal, plain lines every few seconds in a log. With
`--verbosity=1` (absl's flag, `-v 1`) or `TRAINER_VERBOSE=1` everything is shown as the
libraries print it. `quiet_libraries` must run before TensorFlow is imported.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys
import warnings
from collections.abc import Mapping, MutableMapping, Sequence

from absl import logging

VERBOSE_ENV = "TRAINER_VERBOSE"


def verbose(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the user asked for the libraries' output: `--verbosity=N`, `--verbosity N`,
    `-v N` with N >= 1, or TRAINER_VERBOSE set to 1/true/yes."""
    if environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes"):
        return True
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name not in ("--verbosity", "-v"):
            continue
        if not equals:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        try:
            return int(value) >= 1
        except ValueError:
            return False  # absl's own parsing names the bad value
    return False


def quiet_libraries(
    argv: Sequence[str] | None = None, environ: MutableMapping[str, str] | None = None
) -> bool:
    """Unless `verbose`, hides TensorFlow's C++ info and warning lines (a TF_CPP_MIN_LOG_LEVEL
    the user set wins) and Python warnings. Returns whether the output stays verbose."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    if verbose(argv, environ):
        return True
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore")
    return False


class PlainFormatter(std_logging.Formatter):
    """The message alone for info lines; warnings and errors say what they are."""

    def format(self, record: std_logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= std_logging.ERROR:
            return f"error: {message}"
        if record.levelno >= std_logging.WARNING:
            return f"warning: {message}"
        return message


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # trainer/..
_OURS = tuple(os.path.join(_ROOT, package) + os.sep for package in ("trainer", "deploy"))
# TensorFlow's ClusterCoordinator says when a worker fails and when it is back: kept.
_COORDINATOR = os.path.join("tensorflow", "python", "distribute", "coordinator") + os.sep


def _ours_or_error(record: std_logging.LogRecord) -> bool:
    """Lines logged by this project, the cluster coordinator's, and other packages' errors
    (TensorFlow logs its checkpoint and SavedModel chatter through absl too)."""
    return (
        record.levelno >= std_logging.ERROR
        or record.pathname.startswith(_OURS)
        or _COORDINATOR in record.pathname
    )


def plain_lines() -> None:
    """absl's handler prints this project's lines without absl's level/time/thread/file
    prefix, and other packages' only when they are errors; TensorFlow's Python logger (its
    own handler) keeps to the same lines."""
    handler = logging.get_absl_handler()
    handler.setFormatter(PlainFormatter())
    handler.addFilter(_ours_or_error)
    std_logging.getLogger("tensorflow").addFilter(_ours_or_error)


def on_terminal() -> bool:
    """Whether stderr, where progress goes, is a terminal (not a log file or a pipe)."""
    return sys.stderr.isatty()
