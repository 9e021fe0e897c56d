"""The interface an input format implements (`Format`), and `Source`, one opened input.

A format finds its inputs (`claims` a whole pattern, as `bq://` tables; or `matches` a file
by its name), opens them (`open`: the files or streams, the columns and, where the data has
them, their types), reads them as blocks of rows `(file, line, text)` (`reader`), says what is
wrong with a row the parser found malformed and what a row holds in a column (bad rows named
by file and line), and, when a parameter-server worker's dataset cannot read it (it runs the
function the chief traces, with no Python), stages it as CSV shards the workers read
(`stage`; `trainer/input/formats/shards.py`).

A row's text is a CSV line or a serialized tf.Example (`RowText`): formats read in Python
(JSON Lines, BigQuery, Parquet) convert their rows to CSV lines, so one row parser
(`trainer/input/rows.py`) reads every format. Lines converted from another format may mark a
line that could not be converted (`BAD_LINE` + why) and a nested value (`NESTED` + its text):
the first is malformed CSV, the second malformed where its column is used, and both are
described in the source format's words, also when read back from staged shards.
"""

from __future__ import annotations

import abc
import csv
import dataclasses
import enum
import io
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from trainer.errors import InputError
from trainer.input.blocks import Notes
from trainer.input.options import InputOptions
from trainer.input.schema import ColumnChoices

# TFRecord feature types, as tf.train.Feature names its value lists.
BYTES, INT64, FLOAT = "bytes_list", "int64_list", "float_list"

# A line that could not be converted becomes `BAD_LINE` + why: an unclosed quote, which the CSV
# parser finds malformed. A nested value becomes a field starting with `NESTED`, which the row
# parser finds malformed in a column it uses (`Format.nested_values`).
BAD_LINE = b'"\x01'
NESTED = "\x02"


class RowText(enum.Enum):
    """What a block's text holds: a CSV line, or a serialized tf.Example."""

    CSV = "csv"
    EXAMPLE = "example"


@dataclasses.dataclass(frozen=True)
class Reading:
    """How one pass reads a source's files (`Source.blocks`): in this process (else in a
    parameter-server worker's dataset, which cannot call Python); with `lost_tails` a file
    cut short yields its whole lines instead of raising; `notes` records the cuts and
    checksums (`blocks.Notes`); `last_lines`: the last line to read of each file (None: all),
    for TensorFlow's line reader, which cannot tell a cut file."""

    in_process: bool = True
    lost_tails: bool = False
    notes: Notes | None = None
    last_lines: Sequence[int | None] | None = None


# fn(file index, path) -> dataset of blocks `(file, line, text)` of one file.
FileReader = Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset]


class Format(abc.ABC):
    """One input format. Implementations are stateless: one instance each, in the registry."""

    name: str  # as schema.json's summary records it, and an explicit choice names it
    title: str  # in messages: "CSV", "JSON Lines"
    suffixes: tuple[str, ...] = ()  # the names its files have (`matches`)
    row_text: RowText = RowText.CSV
    unit: str = "line"  # what a row's number counts, in messages
    reads_as: str = "CSV text"  # what a pass that fails reads the files as, in messages
    in_graph: bool = True  # a parameter-server worker's dataset reads it (else: staged)
    nested_values: bool = False  # its lines may hold `NESTED` values (malformed where used)
    converted: bool = False  # its lines are converted: a malformed one is described as such
    has_files: bool = True  # files whose size and time a resume checks (not read streams)
    shared_state: bool = False  # replicas read it as the chief opened it (`record`)

    # -- finding and opening ----------------------------------------------------------------
    def claims(self, data: str) -> bool:
        """Whether `data` (a flag's whole value) is this format's, not a list of files."""
        return False

    def matches(self, path: str) -> bool:
        """Whether a file named `path` is in this format."""
        return path.endswith(self.suffixes)

    @abc.abstractmethod
    def open(
        self,
        pattern: str,
        files: tuple[str, ...],
        *,
        flag: str,
        options: InputOptions,
        recorded: dict | None = None,
    ) -> Source:
        """The `Source` of `files` (what `pattern` matched; empty for a pattern the format
        `claims`), its columns checked; `recorded`: what `record` kept of it for this job."""

    def record(self, source: Source) -> dict | None:
        """What the job dir keeps to open the same input again (schema.json's summary, under
        the format's name); None: nothing but its files."""
        return None

    def column_choices(self, source: Source, choices: ColumnChoices) -> ColumnChoices:
        """`choices` with the kinds the data's own column types give (flags win); fails
        naming a used column of a type the trainer cannot read."""
        return choices

    # -- reading ----------------------------------------------------------------------------
    @abc.abstractmethod
    def reader(self, source: Source, reading: Reading) -> tuple[FileReader, bool]:
        """(fn(index, path) -> blocks of one file, whether files are read one at a time)."""

    def check_whole(self, source: Source) -> None:
        """Before a pass: fails on a file that cannot be read whole, where the reader cannot
        tell (compressed TFRecord files)."""
        return None

    # -- bad rows ---------------------------------------------------------------------------
    def describe_malformed(self, text: bytes, columns: tuple[str, ...]) -> str:
        """What is wrong with a row the parser found malformed, after "FLAG: FILE line N "."""
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as e:
            around = text[max(e.start - 20, 0) : e.start + 5]
            return (
                f"is not UTF-8 text (byte 0x{text[e.start]:02x} at position {e.start + 1} of "
                f"the line: {around!r}). Save the file as UTF-8 (e.g. `iconv -f latin1 -t "
                "utf-8`)"
            )
        fields = csv_fields(text)
        if self.converted or is_converted(text, fields):
            return describe_converted(text, columns, fields)
        count = f"has {len(fields)} fields" if fields is not None else "is not valid CSV"
        return (
            f"{count}, the header has {len(columns)}. Fix that line (quote values with commas, "
            "start quoted values right after the comma)"
        )

    def value(self, text: bytes, columns: tuple[str, ...], column: str) -> str:
        """The value a row's text holds in `column`, as the user would write it."""
        fields = csv_fields(text) or []
        index = columns.index(column)
        return fields[index].strip() if index < len(fields) else ""

    # -- parameter-server clusters ----------------------------------------------------------
    def stage(self, source: Source, *, folder: str, name: str) -> Source:
        """`source` as CSV shards `folder/name-*.csv.gz` and their manifest `folder/name.json`
        (written last) that a parameter-server worker reads; the source itself where its
        dataset can read it (`in_graph`)."""
        assert self.in_graph, f"{self.title} stages itself"
        return source

    def reuse_staged(
        self,
        pattern: str,
        files: tuple[str, ...],
        *,
        flag: str,
        options: InputOptions,
        folder: str,
        name: str,
    ) -> Source | None:
        """The shards of `pattern` (`files`, as for `open`) a previous start of this job
        staged completely into `folder` as `name`, or None."""
        return None

    def open_staged(self, pattern: str, *, flag: str, options: InputOptions, manifest: dict):
        """The shards a job staged of `pattern` (schema.json's record, or a manifest); fails
        when the job staged another input."""
        raise NotImplementedError(f"{self.title} input is never staged")

    def __repr__(self) -> str:
        return f"<{self.title} format>"


@dataclasses.dataclass(frozen=True)
class Source:
    """One input: its files, their format and their columns.

    `columns` is the CSV header (in file order), the TFRecord feature names (sorted), the keys
    of JSON Lines files, a table's or a Parquet file's columns; `feature_types` the TFRecord
    type of each (`BYTES`, `INT64`, `FLOAT`), empty for other formats. A BigQuery table's
    "files" are the read streams of its read session. `state` is what the format keeps of an
    opened input (a BigQuery read session, a Parquet file's column types); `staged`, for CSV
    shards a chief staged, their manifest.
    """

    flag: str
    pattern: str
    files: tuple[str, ...]
    format: Format
    columns: tuple[str, ...]
    feature_types: tuple[str, ...] = ()
    state: Any = dataclasses.field(default=None, compare=False)
    staged: dict | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not self.files:
            raise ValueError(f"{self.flag}: a Source needs at least one file.")

    @staticmethod
    def compression(path: str) -> str:
        return "GZIP" if path.endswith(".gz") else ""

    def feature_type(self, column: str) -> str | None:
        """The TFRecord type of `column`; None for other formats."""
        if not self.feature_types:
            return None
        return self.feature_types[self.columns.index(column)]

    def require(self, names, *, what: str) -> None:
        """Fails naming the columns of `names` this source lacks."""
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise InputError(
                f"{self.flag}: column(s) {missing} are missing; {what}. Columns "
                f"found in {self.files[0]}: {', '.join(self.columns)}."
            )

    def origin(self, file: tf.Tensor, line: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Where rows were in the input: (the index of its file, the row's line or record
        number there). For shards a chief staged (`shards.entries`), the input's file and row
        (a shard's line 2, under its header, is its first row); for any other source, where
        the rows are."""
        if not self.staged:
            return file, line
        entries = self.staged["files"]
        origins = tf.constant([e["origin"] for e in entries], tf.int64)
        offsets = tf.constant([e["first_row"] - 2 for e in entries], tf.int64)
        return tf.gather(origins, file), line + tf.gather(offsets, file)

    # -- reading ----------------------------------------------------------------------------
    def indexed_files(self, files: Sequence[int] | None = None) -> tf.data.Dataset:
        """`(index, path)` of the files (or of those with the given indices)."""
        indices = list(range(len(self.files))) if files is None else list(files)
        return tf.data.Dataset.from_tensor_slices(
            (tf.constant(indices, tf.int64), tf.constant([self.files[i] for i in indices]))
        )

    def blocks(
        self,
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
        """Blocks `(file, line, text)` of the files that `files` yields as `(index, path)`
        (`indexed_files`), `parallel` files read at once (one, where the format reads its
        files one at a time), blocks of `cycle` files (default: `parallel`) taken in turn.
        `in_process`, `lost_tails`, `notes`, `last_lines`: see `Reading`; a format read in
        Python cannot be read `in_process=False`."""
        if not in_process and not self.format.in_graph:
            raise InputError(
                f"{self.flag}={self.pattern}: {self.format.title} input is read in Python, "
                "which a parameter-server worker's dataset cannot call (a ps cluster's chief "
                "stages it as CSV files first: trainer/input/formats/shards.py)."
            )
        one_file, serial = self.format.reader(
            self, Reading(in_process, lost_tails, notes, last_lines)
        )
        if serial:
            parallel = 1
        cycle = max(cycle or parallel, parallel)
        if parallel == 1:  # one thread takes the files' blocks in turn
            return files.interleave(one_file, cycle_length=cycle)
        return files.interleave(
            one_file, cycle_length=cycle, num_parallel_calls=parallel, deterministic=deterministic
        )


def with_typed_categorical(choices: ColumnChoices, names) -> ColumnChoices:
    """`choices` with the columns `names` (text by the data's own types) categorical, but for
    those a flag names (numeric, categorical, ignored, the label or the weight)."""
    named = {choices.label, choices.weight, *choices.numeric, *choices.categorical, *choices.ignore}
    text = tuple(n for n in names if n not in named)
    return dataclasses.replace(choices, categorical=choices.categorical + text)


def with_typed_dates(choices: ColumnChoices, names) -> ColumnChoices:
    """`choices` with the columns `names` (dates or timestamps by the data's own types) date
    columns of ISO text, but for those a flag names otherwise (numeric, categorical, ignored,
    the label or the weight) or declares with a format."""
    named = {
        choices.label,
        choices.weight,
        *choices.numeric,
        *choices.categorical,
        *choices.ignore,
        *(n for n, _ in choices.dates),
    }
    typed = tuple((n, "iso") for n in names if n not in named)
    return dataclasses.replace(choices, dates=choices.dates + typed)


def iso_text(array):
    """An Arrow array of dates or timestamps as ISO text (`trainer/input/dates.py` reads it):
    `2024-03-01`, or `2024-03-01T09:00:00` (a timestamp with a zone: in UTC, `...Z`); null
    stays null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_date(kind):
        return pc.strftime(pc.cast(array, pa.timestamp("s")), format="%Y-%m-%d")
    if kind.tz is not None:
        utc = pc.cast(array, pa.timestamp(kind.unit, "UTC"))
        return pc.strftime(pc.cast(utc, pa.timestamp(kind.unit)), format="%Y-%m-%dT%H:%M:%SZ")
    return pc.strftime(array, format="%Y-%m-%dT%H:%M:%S")


# -- CSV lines ----------------------------------------------------------------------------------
def csv_fields(text: bytes) -> list[str] | None:
    """The fields of a CSV line (None: not valid CSV)."""
    try:
        return next(csv.reader(io.StringIO(text.decode("utf-8", "replace"))), [])
    except csv.Error:
        return None


def is_converted(text: bytes, fields: list[str] | None) -> bool:
    """Whether a malformed CSV line is a converted line's mark (`BAD_LINE`, `NESTED`)."""
    return text.startswith(BAD_LINE) or any(f.startswith(NESTED) for f in fields or [])


def bad_line(why: str) -> bytes:
    """The CSV line a line that cannot be converted becomes."""
    return BAD_LINE + why.replace("\n", " ").replace("\r", " ").encode()


def describe_converted(text: bytes, columns: tuple[str, ...], fields: list[str] | None) -> str:
    """What is wrong with a converted line the row parser found malformed (`text`: the CSV
    line, `fields` its fields)."""
    if text.startswith(BAD_LINE):
        return text[len(BAD_LINE) :].decode("utf-8", "replace")
    nested = [(c, f) for c, f in zip(columns, fields or []) if f.startswith(NESTED)]
    if not nested:
        return "cannot be read as a JSON object"
    names = ", ".join(f"{c!r}" for c, _ in nested)
    return (
        f"has a nested value (object or array) at key {names} ({nested[0][1][1:61]}); the "
        "trainer reads numbers, strings, booleans and null. Flatten it, or pass "
        f"--ignore_columns={','.join(c for c, _ in nested)}"
    )
