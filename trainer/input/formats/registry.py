"""The input formats this trainer reads, found by name: a format claims a flag's whole value
(`bq://` tables), else each file is read in the first format its name matches, CSV last (it
takes any file), or in the format the user or Vertex AI chose (`InputOptions.data_format`)."""

from __future__ import annotations

from trainer.errors import InputError
from trainer.input.formats import bigquery, csv, jsonl, parquet, tfrecord
from trainer.input.formats.base import Format

# In the order a file's name is tried.
FORMATS: tuple[Format, ...] = (
    bigquery.BIGQUERY,
    jsonl.JSONL,
    tfrecord.TFRECORD,
    parquet.PARQUET,
    csv.CSV,
)


def named(name: str, *, what: str) -> Format:
    """The format called `name` (as `Format.name`); `what` says where the name was given."""
    for fmt in FORMATS:
        if fmt.name == name.strip().lower():
            return fmt
    raise InputError(
        f"{what}={name!r} is not an input format this trainer reads; choose from "
        f"{', '.join(f.name for f in FORMATS)}."
    )


def claiming(data: str) -> Format | None:
    """The format whose inputs look like `data` as a whole (a table's URI), if any."""
    return next((fmt for fmt in FORMATS if fmt.claims(data)), None)


def of_file(path: str) -> Format:
    """The format a file named `path` is read in."""
    return next(fmt for fmt in FORMATS if fmt.matches(path))


def staged(manifest: dict) -> Format:
    """The format whose input a staging manifest holds (manifests written before they named
    it: a table's has its "table", JSON Lines' its "jsonl")."""
    return named(
        manifest.get("format") or ("jsonl" if "jsonl" in manifest else "bigquery"),
        what="a staging manifest's format",
    )
