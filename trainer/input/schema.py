"""The data schema: which columns are numeric or categorical, their statistics and encoding, the
label, and what was read.

Computed once from the training data by the chief (`trainer/input/scan.py`, one streaming
pass), saved as `schema.json` in the job dir, and built into the exported model, so that
serving takes raw values and a resumed job, a worker and the evaluator encode data exactly as
the first run did without reading the training data again.

The rules here are pure functions of what the scan counted, tested without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from trainer.errors import InputError
from trainer.input import dates

# Values that mean "missing" in a numeric column and in the label (a row without a label is a
# bad row). Categorical columns keep them as a category.
MISSING_TOKENS = frozenset(["", "?", "NA", "N/A", "NaN", "nan", "null", "NULL", "None"])

# A column where at least this share of values parses as numbers, but not all, is a typo in
# a numeric column far more often than a categorical column.
NUMERIC_TYPO_SHARE = 0.95
# Integer labels with at most this many distinct values are classes, not a regression target.
_MAX_INTEGER_CLASSES = 10
# Labels with more distinct values than this are not classes this trainer learns.
MAX_CLASSES = 1000
SCHEMA_VERSION = 2
# A feature column is an input of the exported model's serving signature, named by it; a name
# outside this TensorFlow renames there (`a-b` is served as `a_b`) or cannot export at all (a
# space, a leading underscore).
SERVING_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class Kind(str, enum.Enum):
    NUMERIC = "numeric"
    CATEGORICAL = "categorical"
    DATETIME = "datetime"


class HeadType(str, enum.Enum):
    BINARY = "binary"
    MULTICLASS = "multiclass"
    REGRESSION = "regression"


class Encoding(str, enum.Enum):
    """How a categorical column reaches the subnetworks."""

    ONE_HOT = "one_hot"  # vocabulary + 1 inputs, in the dense features
    EMBEDDING = "embedding"  # an id; each subnetwork learns a table of embedding_dim vectors


@dataclasses.dataclass(frozen=True)
class NumericColumn:
    """A numeric feature: its standardised value, then (`indicator`) whether it was missing,
    then a piecewise-linear encoding over quantile bins whose edges are `edges` (first edge
    the minimum, last the maximum). `count` values were present and `missing` were not (they
    are encoded as the mean; with the indicator, 1 says so). The indicator is given to a
    column missing in some training rows (`--missing_indicators`); schemas written before it
    existed read as without one."""

    name: str
    mean: float
    std: float
    edges: tuple[float, ...] = ()
    count: int = 0
    missing: int = 0
    min: float | None = None
    max: float | None = None
    indicator: bool = False

    kind = Kind.NUMERIC

    @property
    def num_bins(self) -> int:
        return max(0, len(self.edges) - 1)

    @property
    def width(self) -> int:
        return 1 + int(self.indicator) + self.num_bins


@dataclasses.dataclass(frozen=True)
class CategoricalColumn:
    """A categorical feature: its vocabulary (most frequent first, with the count of each),
    plus one out-of-vocabulary id for everything else. Small vocabularies are one-hot; larger
    ones are ids into an embedding table of `embedding_dim` per subnetwork, whose cost per
    example does not grow with the vocabulary. `count_error` bounds how low each count may be
    (0: exact; see `trainer/input/stats.py`)."""

    name: str
    vocabulary: tuple[str, ...]
    counts: tuple[int, ...] = ()
    encoding: Encoding = Encoding.ONE_HOT
    embedding_dim: int = 0
    count_error: int = 0

    kind = Kind.CATEGORICAL

    def __post_init__(self):
        if (self.encoding is Encoding.EMBEDDING) != (self.embedding_dim > 0):
            raise ValueError(
                f"column '{self.name}': embedding_dim ({self.embedding_dim}) must "
                "be > 0 exactly for an embedding."
            )

    @property
    def size(self) -> int:
        """Ids: the vocabulary and the out-of-vocabulary id (the last)."""
        return len(self.vocabulary) + 1

    @property
    def width(self) -> int:
        """Inputs in the dense features (0 for an embedded column)."""
        return self.size if self.encoding is Encoding.ONE_HOT else 0


@dataclasses.dataclass(frozen=True)
class DateColumn:
    """A date or date-time feature, read as text in `format` (`trainer/input/dates.py`: what the
    model gets of it). `mean` and `std` are the training values' UTC seconds', `year_mean` and
    `year_std` their years'; `has_time`: some carry a time of day. `count` values parsed and
    `missing` did not (or were empty)."""

    name: str
    format: str
    mean: float
    std: float
    year_mean: float
    year_std: float
    has_time: bool = False
    count: int = 0
    missing: int = 0
    min: float | None = None
    max: float | None = None

    kind = Kind.DATETIME

    @property
    def width(self) -> int:
        """Seconds, year, month (2), day (2), weekday (2), time of day (2, with times), the
        missing indicator."""
        return 8 + (2 if self.has_time else 0) + 1

    @property
    def indicator_position(self) -> int:
        """The missing indicator's position in the column's encoding: the last."""
        return self.width - 1

    def baseline_text(self) -> str:
        """The date-time at the training mean, as text of the column's format (the
        explanation baseline's value)."""
        moment = datetime.datetime.fromtimestamp(self.mean, tz=datetime.timezone.utc)
        day = {"iso": "%Y-%m-%d", "mdy": "%m/%d/%Y", "dmy": "%d/%m/%Y"}[self.format]
        return moment.strftime(day + (" %H:%M:%S" if self.has_time else ""))


Column = NumericColumn | CategoricalColumn | DateColumn


@dataclasses.dataclass(frozen=True)
class Embedded:
    """An embedded column as a subnetwork sees it: ids in [0, size), vectors of `dim`."""

    name: str
    size: int
    dim: int


@dataclasses.dataclass(frozen=True)
class Label:
    """The label column and the head it implies.

    Classification labels are class names (`classes`, sorted); class id i is `classes[i]`.
    Regression labels are standardised with `mean` and `std` for training.
    """

    name: str
    head: HeadType
    classes: tuple[str, ...] = ()
    mean: float = 0.0
    std: float = 1.0

    def __post_init__(self):
        if self.head is not HeadType.REGRESSION and len(self.classes) < 2:
            raise InputError(
                f"label column '{self.name}' has {len(self.classes)} distinct value(s) "
                f"{list(self.classes)}; a {self.head.value} head needs at least 2. Check "
                "--label_column and the training data."
            )
        if self.head is HeadType.BINARY and len(self.classes) != 2:
            raise InputError(
                f"--head=binary needs exactly 2 label values, label column '{self.name}' has "
                f"{len(self.classes)}: {list(self.classes)[:10]}. Use --head=multiclass."
            )

    @property
    def logits_dimension(self) -> int:
        return len(self.classes) if self.head is HeadType.MULTICLASS else 1

    @property
    def is_regression(self) -> bool:
        return self.head is HeadType.REGRESSION


@dataclasses.dataclass(frozen=True)
class Weight:
    """The example weight column (`--weight_column`): not a feature, a finite number >= 0 in
    every row. `mean` is its mean over the training rows: training scales each weight by
    1 / mean, so the loss keeps the scale of an unweighted one (a weight of 10 everywhere
    trains as no weight does) and the learning rate means the same."""

    name: str
    mean: float = 1.0

    def __post_init__(self):
        if not self.mean > 0:
            raise ValueError(f"weight column '{self.name}': mean ({self.mean}) must be > 0.")


@dataclasses.dataclass(frozen=True)
class Schema:
    """Feature columns in input order, the label, the example weight if any, and (`summary`)
    what the scan read: rows per file, bad rows, the hold-out, and how the statistics were
    computed."""

    columns: tuple[Column, ...]
    label: Label
    summary: Mapping = dataclasses.field(default_factory=dict, compare=False, hash=False)
    weight: Weight | None = None

    def __post_init__(self):
        if not self.columns:
            raise InputError(
                f"no feature columns besides the label '{self.label.name}': the model needs "
                "at least one. Check --ignore_columns and the header of the data."
            )

    @property
    def dense_width(self) -> int:
        """Inputs of the dense part of the encoding."""
        return sum(c.width for c in self.columns)

    @property
    def plain_positions(self) -> tuple[int, ...]:
        """Positions in the dense encoding of each numeric column's standardised value (and
        missing indicator), of the one-hots and of the date columns' parts: all but the
        piecewise-linear bins."""
        positions: list[int] = []
        start = 0
        for c in self.columns:
            if isinstance(c, NumericColumn):
                positions.extend(range(start, start + 1 + int(c.indicator)))
            else:
                positions.extend(range(start, start + c.width))
            start += c.width
        return tuple(positions)

    @property
    def indicated_positions(self) -> tuple[tuple[int, int], ...]:
        """(position of the standardised value, position of the missing indicator) in the
        dense encoding, for each numeric column with an indicator and each date column (its
        seconds)."""
        pairs: list[tuple[int, int]] = []
        start = 0
        for c in self.columns:
            if isinstance(c, NumericColumn) and c.indicator:
                pairs.append((start, start + 1))
            elif isinstance(c, DateColumn):
                pairs.append((start, start + c.indicator_position))
            start += c.width
        return tuple(pairs)

    @property
    def embedded(self) -> tuple[Embedded, ...]:
        return tuple(
            Embedded(c.name, c.size, c.embedding_dim)
            for c in self.columns
            if isinstance(c, CategoricalColumn) and c.encoding is Encoding.EMBEDDING
        )

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def numeric_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.kind is Kind.NUMERIC)

    @property
    def categorical_names(self) -> tuple[str, ...]:
        """The columns read as text: categories and dates."""
        return tuple(c.name for c in self.columns if c.kind is not Kind.NUMERIC)

    def bytes_per_example(self) -> int:
        """Memory of one encoded example: dense floats, embedding ids, the label and the
        weight."""
        return 4 * self.dense_width + 8 * len(self.embedded) + 8 + (4 if self.weight else 0)

    def to_json(self) -> str:
        def column(c):
            data = {"kind": c.kind.value, **dataclasses.asdict(c)}
            if c.kind is Kind.CATEGORICAL:
                data["encoding"] = c.encoding.value
            return data

        label = dataclasses.asdict(self.label)
        label["head"] = self.label.head.value
        data = {
            "version": SCHEMA_VERSION,
            "columns": [column(c) for c in self.columns],
            "label": label,
            "input": dict(self.summary),
        }
        if self.weight:  # absent without one: schemas written before weights read the same
            data["weight"] = dataclasses.asdict(self.weight)
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, *, path: str = "schema.json") -> Schema:
        return cls.from_document(json.loads(text), path=path)

    @classmethod
    def from_document(cls, data: dict, *, path: str = "schema.json") -> Schema:
        """The schema of schema.json's parsed JSON (`path` names it in errors)."""
        if data.get("version") != SCHEMA_VERSION:
            raise InputError(
                f"{path} was written by another version of this trainer (schema "
                f"version {data.get('version')}, this one reads "
                f"{SCHEMA_VERSION}). Train in a new --job_dir."
            )
        columns: list[Column] = []
        for c in data["columns"]:
            kind = Kind(c.pop("kind"))
            if kind is Kind.NUMERIC:
                c["edges"] = tuple(c["edges"])
                columns.append(NumericColumn(**c))
            elif kind is Kind.DATETIME:
                columns.append(DateColumn(**c))
            else:
                c.update(
                    vocabulary=tuple(c["vocabulary"]),
                    counts=tuple(c["counts"]),
                    encoding=Encoding(c["encoding"]),
                )
                columns.append(CategoricalColumn(**c))
        label = dict(data["label"])
        label["head"] = HeadType(label["head"])
        label["classes"] = tuple(label["classes"])
        weight = Weight(**data["weight"]) if data.get("weight") else None
        return cls(tuple(columns), Label(**label), data.get("input", {}), weight)


@dataclasses.dataclass(frozen=True)
class ColumnChoices:
    """What the user said about columns and their encoding; empty means infer. `weight`:
    the example weight column, if any."""

    label: str
    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    head: HeadType | None = None
    num_bins: int = 32
    max_vocabulary_size: int = 100_000
    one_hot_max_size: int = 64
    embedding_dim: int = 16
    weight: str | None = None
    missing_indicators: bool = True
    # (column, format) of date columns declared (--date_columns) or typed so by the data
    # (a Parquet timestamp, a BigQuery DATE); text columns of ISO dates are found by the scan
    dates: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        for name in ("num_bins",):
            if getattr(self, name) < 0:
                raise InputError(f"--{name} ({getattr(self, name)}) must be >= 0.")
        for name in ("max_vocabulary_size", "one_hot_max_size", "embedding_dim"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name} ({getattr(self, name)}) must be >= 1.")


def check_choices(header: Sequence[str], choices: ColumnChoices, *, source: str) -> None:
    """Fails when a flag names a column the data does not have, or names one twice."""
    known = set(header)
    if not choices.label:
        raise InputError(
            "--label_column is required: name the column to predict "
            f"(columns in {source}: {', '.join(header)})."
        )
    if choices.label not in known:
        raise InputError(
            f"--label_column='{choices.label}' is not a column of {source}; "
            f"its columns are: {', '.join(header)}."
        )
    declared_dates = tuple(name for name, _ in choices.dates)
    for flag, names in (
        ("--numeric_columns", choices.numeric),
        ("--categorical_columns", choices.categorical),
        ("--ignore_columns", choices.ignore),
        ("--date_columns", declared_dates),
    ):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(
                f"{flag} names unknown column(s) {unknown}; columns of {source} "
                f"are: {', '.join(header)}."
            )
        if choices.label in names:
            raise InputError(f"{flag} names the label column '{choices.label}'; remove it.")
    both = set(choices.numeric) & set(choices.categorical)
    if both:
        raise InputError(
            f"column(s) {sorted(both)} are in both --numeric_columns and "
            "--categorical_columns; name each column once."
        )
    named = set(choices.numeric) | set(choices.categorical) | set(choices.ignore)
    if named & set(declared_dates):
        raise InputError(
            f"column(s) {sorted(named & set(declared_dates))} are in --date_columns and another "
            "of --numeric_columns, --categorical_columns, --ignore_columns; name each once."
        )
    check_weight(header, choices, source=source)
    features = [c for c in header if c not in (choices.label, choices.weight, *choices.ignore)]
    unservable = [c for c in features if not SERVING_NAME.fullmatch(c)]
    if unservable:
        renamed = ", ".join(f"{c!r} -> {_servable(c)!r}" for c in unservable[:3])
        raise InputError(
            f"column(s) {unservable} of {source} cannot name an input of the exported model "
            "(its serving signature takes each feature by its column name, and TensorFlow "
            "keeps only names of letters, digits and underscores that start with a letter). "
            f"Rename them in the data (e.g. {renamed}), or leave them out with --ignore_columns."
        )


def _servable(name: str) -> str:
    """A serving name close to `name`, for the error message."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name).lstrip("_")
    return cleaned if cleaned[:1].isalpha() else f"c_{cleaned}"


def check_weight(header: Sequence[str], choices: ColumnChoices, *, source: str) -> None:
    """Fails when --weight_column is not a column of the data, or is the label or a column
    named as a feature or ignored (a weight is neither)."""
    weight = choices.weight
    if weight is None:
        return
    if weight not in header:
        raise InputError(
            f"--weight_column='{weight}' is not a column of {source}; its columns are: "
            f"{', '.join(header)}."
        )
    if weight == choices.label:
        raise InputError(
            f"--weight_column='{weight}' is the label column; the weight must be a column "
            "of its own."
        )
    for flag, names in (
        ("--numeric_columns", choices.numeric),
        ("--categorical_columns", choices.categorical),
        ("--ignore_columns", choices.ignore),
    ):
        if weight in names:
            raise InputError(
                f"{flag} names the weight column '{weight}'; a weight is not a feature "
                "(nor ignored). Remove it from that flag."
            )


# -- inference from what the scan counted ---------------------------------------------------
def infer_kind(name: str, choices: ColumnChoices, *, numbers: int, not_numbers: int) -> Kind:
    """A column's kind from a sample of it: `numbers` values parsed as numbers and
    `not_numbers` did not (missing values count as neither). A numeric column may hold a few
    typos (they are bad rows); a column with many non-numbers is categorical."""
    if name in choices.categorical or name in dict(choices.dates):
        return Kind.CATEGORICAL  # text (a declared date column is parsed from its text)
    if name in choices.numeric or not_numbers == 0:
        return Kind.NUMERIC
    share = numbers / (numbers + not_numbers)
    return Kind.NUMERIC if share >= NUMERIC_TYPO_SHARE else Kind.CATEGORICAL


def numeric_column(
    name: str,
    *,
    count: int,
    missing: int,
    mean: float,
    std: float,
    minimum: float,
    maximum: float,
    sample: np.ndarray,
    num_bins: int,
    missing_indicator: bool = False,
) -> NumericColumn:
    """The column's encoding from its statistics; an indicator of missing values where
    `missing_indicator` and some training rows miss it."""
    if count == 0:
        raise InputError(
            f"numeric column '{name}' has no values in the training data; drop it "
            f"with --ignore_columns={name}."
        )
    return NumericColumn(
        name,
        float(mean),
        float(std) or 1.0,
        quantile_edges(sample, num_bins),
        count=count,
        missing=missing,
        min=float(minimum),
        max=float(maximum),
        indicator=missing_indicator and missing > 0,
    )


def quantile_edges(values: np.ndarray, num_bins: int) -> tuple[float, ...]:
    """Bin edges at the quantiles of `values`, from the minimum to the maximum.

    A column dominated by one value (capital gains: 92% zeros) has few distinct quantiles;
    the quantiles of the other values are added, so that the rest of the range is binned too.
    """
    if num_bins < 1 or values.size == 0:
        return ()
    levels = np.linspace(0, 1, num_bins + 1)
    edges = [np.quantile(values, levels)]
    distinct, counts = np.unique(values, return_counts=True)
    rest = values[values != distinct[np.argmax(counts)]]
    if len(np.unique(edges[0])) < num_bins + 1 and rest.size:
        edges.append(np.quantile(rest, levels))
    edges = np.unique(np.concatenate(edges))
    return tuple(float(e) for e in edges) if len(edges) > 1 else ()


def categorical_column(
    name: str, most_common: Sequence[tuple[str, int]], *, count_error: int, choices: ColumnChoices
) -> CategoricalColumn:
    """The vocabulary (most frequent first, at most `max_vocabulary_size`), one-hot up to
    `one_hot_max_size` values, else an embedding of dim min(embedding_dim, 1.6 * n^0.56)
    (fast.ai's rule of thumb for tabular embeddings)."""
    most_common = list(most_common)[: choices.max_vocabulary_size]
    vocabulary = tuple(v for v, _ in most_common)
    counts = tuple(int(c) for _, c in most_common)
    if len(vocabulary) <= choices.one_hot_max_size:
        return CategoricalColumn(name, vocabulary, counts, count_error=count_error)
    dim = max(1, min(choices.embedding_dim, round(1.6 * (len(vocabulary) + 1) ** 0.56)))
    return CategoricalColumn(
        name, vocabulary, counts, Encoding.EMBEDDING, dim, count_error=count_error
    )


# A date or a date-time as text: 2024-03-01, 2005-01-13 09:00:00, 2024-03-01T09:00Z, 3/1/2024.
_DATE = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
    r"(?: ?(?:Z|[+-]\d{2}:?\d{2}))?)?|\d{1,2}/\d{1,2}/\d{2,4}(?: \d{1,2}:\d{2}(?::\d{2})?)?"
)
# A categorical column is near-unique when its values average fewer than this many rows each:
# an id or free text, whose categories a model can only memorise.
NEAR_UNIQUE_ROWS_PER_VALUE = 2.0
_MIN_DISTINCT_TO_WARN = 20  # fewer values is a small category set, however few the rows


def column_warnings(
    name: str, sample: Sequence[str], *, distinct: int, rows: int, exact: bool
) -> list[str]:
    """Why categorical column `name` will not train well, and the fix: values that look like
    dates (`sample`: its most frequent values), or so many distinct values (`distinct`, a lower
    bound unless `exact`, over `rows` non-missing values) that each is seen about once."""
    values = [v for v in sample if v.strip()]
    if distinct < _MIN_DISTINCT_TO_WARN or not values:
        return []
    per_value = rows / distinct
    how_many = f"{distinct:,}{'' if exact else '+'} values in {rows:,} rows, {per_value:.1f} each"
    dates = sum(bool(_DATE.fullmatch(v.strip())) for v in values)
    if dates >= 0.9 * len(values):
        return [
            f"column '{name}' looks like dates (e.g. '{values[0]}') and is read as a category "
            f"({how_many}), which a model can only memorise: read it as dates with "
            f"--date_columns={name}:mdy (month first) or {name}:dmy (day first), or drop it "
            f"with --ignore_columns={name}."
        ]
    if per_value < NEAR_UNIQUE_ROWS_PER_VALUE:
        return [
            f"column '{name}' is nearly unique per row ({how_many}): an id or free text, "
            f"which a model can only memorise; drop it with --ignore_columns={name}."
        ]
    return []


def date_column(
    name: str, values: Sequence[tuple[str, int]], *, fmt: str, missing: int, declared: bool
) -> DateColumn:
    """A date column from its counted values (text, count) read as `fmt`; values that do not
    parse count as missing, beside `missing` empty ones. A declared column (`--date_columns`)
    most of whose values do not parse stops the job, naming one."""
    read = [(text, c, dates.parse(text, fmt)) for text, c in values]  # each value parsed once
    total = sum(c for _, c, _ in read)
    parsed = [(p, c) for _, c, p in read if p is not None]
    count = sum(c for _, c in parsed)
    if declared and total and count < dates.DECLARED_SHARE * total:
        example = next(text for text, _, p in read if p is None)
        raise InputError(
            f"--date_columns names '{name}' as {fmt} dates, but {1 - count / total:.0%} of its "
            f"values do not parse as such (e.g. '{example}'). Give its format "
            f"({', '.join(dates.FORMATS)}: --date_columns={name}:mdy), or drop it from "
            "--date_columns."
        )
    seconds = [(p.seconds, c) for p, c in parsed]
    mean, std = dates.moments(seconds)
    year_mean, year_std = dates.moments([(float(p.year), c) for p, c in parsed])
    timed = [dates.has_time(text, fmt) for text, _, p in read[:1000] if p is not None]
    return DateColumn(
        name,
        fmt,
        mean,
        std or 86400.0,
        year_mean,
        max(year_std, 1.0),
        has_time=any(timed),
        count=count,
        missing=missing + total - count,
        min=min((s for s, _ in seconds), default=None),
        max=max((s for s, _ in seconds), default=None),
    )


def detected_dates(values: Sequence[tuple[str, int]]) -> bool:
    """Whether a text column's counted values (text, count; the most frequent) are ISO dates:
    `dates.DETECT_SHARE` of them parse."""
    share, total = dates.parsed_share(values, "iso")
    return total > 0 and share >= dates.DETECT_SHARE


def infer_label(
    name: str,
    head: HeadType | None,
    *,
    distinct: Mapping[str, int] | None,
    all_numbers: bool,
    all_integral: bool,
    mean: float,
    std: float,
) -> Label:
    """The label's head and classes (or mean and std) from its values: `distinct` maps each
    canonical value to its count (None: more than `MAX_CLASSES` distinct values). Without
    `head`, labels that are not all numbers are classes (binary for two), integral numbers
    with few distinct values are classes, other numbers a regression target."""
    if head is None:
        if not all_numbers:
            if distinct is None:
                raise InputError(
                    f"label column '{name}' holds more than {MAX_CLASSES} distinct "
                    "values, not all numbers: too many to be classes. Check "
                    "--label_column."
                )
            head = HeadType.BINARY if len(distinct) == 2 else HeadType.MULTICLASS
        elif distinct is not None and all_integral and len(distinct) <= _MAX_INTEGER_CLASSES:
            head = HeadType.BINARY if len(distinct) == 2 else HeadType.MULTICLASS
        else:
            head = HeadType.REGRESSION
    if head is HeadType.REGRESSION:
        if not math.isfinite(mean):
            raise InputError(
                f"label column '{name}' has no numeric values: regression labels "
                "must be finite numbers."
            )
        return Label(name, head, mean=float(mean), std=float(std) or 1.0)
    if distinct is None:
        raise InputError(
            f"label column '{name}' holds more than {MAX_CLASSES} distinct values; "
            f"a {head.value} head learns at most {MAX_CLASSES} classes. Use "
            "--head=regression for a numeric target."
        )
    return Label(name, head, classes=tuple(sorted(distinct)))
