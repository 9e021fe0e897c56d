"""Finding an input and opening it in its format (`trainer/input/formats/`): the files a flag
names, the format they are in, and what a pipeline needs to know before it starts (the
columns, checked by the format).

Paths may be local, `gs://BUCKET/...` or `/gcs/BUCKET/...`, as a path, a glob or a
comma-separated list of them. Every check here runs before any data row is read, so a wrong
path or a file with other columns stops the job at once.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence

import tensorflow as tf

from trainer.errors import InputError
from trainer.input.formats import registry
from trainer.input.formats.base import Format, Source
from trainer.input.options import InputOptions

# The census income data shipped in the package: the default input.
_PACKAGE_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
CENSUS_TRAIN = os.path.join(_PACKAGE_DATA, "census", "train.csv.gz")
CENSUS_TEST = os.path.join(_PACKAGE_DATA, "census", "test.csv.gz")
CENSUS_LABEL = "income_bracket"

# File identities are read in parallel: on Cloud Storage each one is a round trip.
_STAT_THREADS = 16


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


# Compressions this trainer does not read (gzip only, as TensorFlow's readers), by name (a
# CSV file's first bytes tell them too: `formats.csv.csv_header`).
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


def _check_compression(files: list[str], *, flag: str) -> None:
    """Fails on a file compressed in a way this trainer does not read."""
    for path in files:
        for suffix, name in _OTHER_COMPRESSIONS.items():
            if path.endswith(suffix):
                raise InputError(
                    f"{flag}: {path} is compressed with {name}, which this trainer does not "
                    "read: decompress it, or compress it with gzip (*.gz)."
                )


def open_source(
    pattern_list: str,
    *,
    flag: str,
    options: InputOptions | None = None,
    recorded: dict | None = None,
    jsonl: bool = False,
) -> Source:
    """The input `pattern_list` opened in its format (`detect`), its columns checked (in files,
    the same columns in every file). `recorded`: what the format's `record` kept of it for
    this job (a BigQuery read session). With `jsonl` every file is read as JSON Lines,
    whatever its name (as `InputOptions.jsonl`)."""
    options = options or InputOptions(jsonl=jsonl)
    fmt, files = detect(pattern_list, flag=flag, options=options)
    return fmt.open(pattern_list, files, flag=flag, options=options, recorded=recorded)


def detect(
    pattern_list: str, *, flag: str, options: InputOptions
) -> tuple[Format, tuple[str, ...]]:
    """The format of an input and its files (none for an input a format claims whole, a
    table): the format chosen (`options.data_format`), else each file's by its name; fails
    when the files are in several formats."""
    claimed = registry.claiming(pattern_list)
    if claimed is not None:
        return claimed, ()
    files = expand(pattern_list, flag=flag)
    _check_compression(files, flag=flag)
    if options.data_format:
        return registry.named(options.data_format, what="the input format"), tuple(files)
    of_files = {registry.of_file(f) for f in files}
    if len(of_files) > 1:
        mixed = " and ".join(fmt.title for fmt in registry.FORMATS if fmt in of_files)
        named = ", ".join(
            f"{fmt.title} *{fmt.suffixes[0]}" for fmt in registry.FORMATS if fmt.suffixes
        )
        raise InputError(
            f"{flag} mixes {mixed} files: {files[:5]}. Use one format (files are read by "
            f"their names: {named}, CSV any other)."
        )
    (fmt,) = of_files
    return fmt, tuple(files)


def identities(paths: Sequence[str]) -> list[dict]:
    """Each file's size and modification time (ns), read in parallel: what a rewrite changes
    (on Cloud Storage a rewrite is a new generation, with a new update time)."""

    def one(path: str) -> dict:
        stat = tf.io.gfile.stat(path)
        return {"bytes": int(stat.length), "modified_ns": int(stat.mtime_nsec)}

    if not paths:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(_STAT_THREADS, len(paths))) as pool:
        return list(pool.map(one, paths))


# Vertex AI managed datasets: AIP_DATA_FORMAT, and the scheme its URIs have.
MANAGED_FORMATS = {"bigquery": "bq://", "csv": "gs://", "jsonl": "gs://"}


def managed_dataset(
    data_format: str | None, *, training: str, validation: str | None, test: str | None = None
) -> tuple[str, str | None, str | None]:
    """(train data, eval data, test data) of a Vertex AI managed dataset, from the URIs Vertex
    passes (`AIP_TRAINING_DATA_URI`, `AIP_VALIDATION_DATA_URI`, `AIP_TEST_DATA_URI`): a
    table, or gs:// wildcards of CSV
    or JSON Lines files (`jsonl`: read with `open_source(jsonl=True)`, whatever the files'
    names). Fails naming an unknown `AIP_DATA_FORMAT`, or a URI of another kind than the
    format."""
    fmt = (data_format or "").strip().lower()
    if fmt not in MANAGED_FORMATS:
        raise InputError(
            f"AIP_DATA_FORMAT={data_format!r} is not a managed dataset format this trainer "
            f"knows ({', '.join(MANAGED_FORMATS)}); AIP_TRAINING_DATA_URI={training}."
        )
    uris = (
        ("AIP_TRAINING_DATA_URI", training),
        ("AIP_VALIDATION_DATA_URI", validation),
        ("AIP_TEST_DATA_URI", test),
    )
    for name, uri in uris:
        if uri and not uri.strip().startswith(MANAGED_FORMATS[fmt]):
            raise InputError(
                f"{name}={uri} does not start with {MANAGED_FORMATS[fmt]}, as "
                f"AIP_DATA_FORMAT={fmt} data must."
            )
    return training, validation, test
