"""The data schema: which columns are numeric or categorical, their statistics, and the label.

Inferred once from the training data (overridable by flags), saved as `schema.json` in the job
dir and built into the exported model, so that serving takes raw values and a resumed job
encodes its data exactly as the first run did.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Sequence

import numpy as np

from trainer.errors import InputError

# Values that mean "missing" in a numeric column. Categorical columns keep them as a category.
MISSING_TOKENS = frozenset(["", "?", "NA", "N/A", "NaN", "nan", "null", "NULL", "None"])

# A column where at least this share of values parses as numbers, but not all, is a typo in
# a numeric column far more often than a categorical column.
_NUMERIC_TYPO_SHARE = 0.95
# Integer labels with at most this many distinct values are classes, not a regression target.
_MAX_INTEGER_CLASSES = 10


class Kind(str, enum.Enum):
    NUMERIC = "numeric"
    CATEGORICAL = "categorical"


class HeadType(str, enum.Enum):
    BINARY = "binary"
    MULTICLASS = "multiclass"
    REGRESSION = "regression"


@dataclasses.dataclass(frozen=True)
class NumericColumn:
    """A numeric feature: its standardised value, plus a piecewise-linear encoding over
    quantile bins whose edges are `edges` (first edge the minimum, last the maximum)."""

    name: str
    mean: float
    std: float
    edges: tuple[float, ...] = ()

    kind = Kind.NUMERIC

    @property
    def num_bins(self) -> int:
        return max(0, len(self.edges) - 1)

    @property
    def width(self) -> int:
        return 1 + self.num_bins


@dataclasses.dataclass(frozen=True)
class CategoricalColumn:
    """A categorical feature: one-hot over its vocabulary plus one out-of-vocabulary slot."""

    name: str
    vocabulary: tuple[str, ...]

    kind = Kind.CATEGORICAL

    @property
    def width(self) -> int:
        return len(self.vocabulary) + 1


Column = NumericColumn | CategoricalColumn


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
                "--label_column and the training data.")
        if self.head is HeadType.BINARY and len(self.classes) != 2:
            raise InputError(
                f"--head=binary needs exactly 2 label values, label column '{self.name}' has "
                f"{len(self.classes)}: {list(self.classes)[:10]}. Use --head=multiclass.")

    @property
    def logits_dimension(self) -> int:
        return len(self.classes) if self.head is HeadType.MULTICLASS else 1


@dataclasses.dataclass(frozen=True)
class Schema:
    """Feature columns in input order, and the label."""

    columns: tuple[Column, ...]
    label: Label

    def __post_init__(self):
        if not self.columns:
            raise InputError(
                f"no feature columns besides the label '{self.label.name}': the model needs "
                "at least one. Check --ignore_columns and the header of the data.")

    @property
    def input_dim(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def to_json(self) -> str:
        def column(c):
            return {"kind": c.kind.value, **dataclasses.asdict(c)}
        label = dataclasses.asdict(self.label)
        label["head"] = self.label.head.value
        return json.dumps({"columns": [column(c) for c in self.columns], "label": label},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Schema":
        data = json.loads(text)
        columns = []
        for c in data["columns"]:
            kind = Kind(c.pop("kind"))
            if kind is Kind.NUMERIC:
                columns.append(NumericColumn(c["name"], c["mean"], c["std"],
                                             tuple(c["edges"])))
            else:
                columns.append(CategoricalColumn(c["name"], tuple(c["vocabulary"])))
        label = dict(data["label"])
        label["head"] = HeadType(label["head"])
        label["classes"] = tuple(label["classes"])
        return cls(tuple(columns), Label(**label))


@dataclasses.dataclass(frozen=True)
class ColumnChoices:
    """What the user said about columns; empty means infer."""

    label: str
    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    head: HeadType | None = None
    num_bins: int = 16
    max_vocabulary_size: int = 1000


def parse_numbers(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parses strings as float64; returns (numbers with NaN for missing, mask of unparsable)."""
    out = np.full(values.shape, np.nan)
    bad = np.zeros(values.shape, dtype=bool)
    uniques, inverse = np.unique(values, return_inverse=True)
    parsed = np.full(uniques.shape, np.nan)
    bad_unique = np.zeros(uniques.shape, dtype=bool)
    for i, text in enumerate(uniques):
        text = text.strip()
        if text in MISSING_TOKENS:
            continue
        try:
            parsed[i] = float(text)
        except ValueError:
            bad_unique[i] = True
    out[:] = parsed[inverse]
    bad[:] = bad_unique[inverse]
    return out, bad


def check_choices(header: Sequence[str], choices: ColumnChoices, *, source: str) -> None:
    """Fails when a flag names a column the data does not have, or names one twice."""
    known = set(header)
    if not choices.label:
        raise InputError("--label_column is required: name the column to predict "
                         f"(columns in {source}: {', '.join(header)}).")
    if choices.label not in known:
        raise InputError(f"--label_column='{choices.label}' is not a column of {source}; "
                         f"its columns are: {', '.join(header)}.")
    for flag, names in (("--numeric_columns", choices.numeric),
                        ("--categorical_columns", choices.categorical),
                        ("--ignore_columns", choices.ignore)):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(f"{flag} names unknown column(s) {unknown}; columns of {source} "
                             f"are: {', '.join(header)}.")
        if choices.label in names:
            raise InputError(f"{flag} names the label column '{choices.label}'; remove it.")
    both = set(choices.numeric) & set(choices.categorical)
    if both:
        raise InputError(f"column(s) {sorted(both)} are in both --numeric_columns and "
                         "--categorical_columns; name each column once.")


def regression_targets(name: str, values: np.ndarray, where: "Locator") -> np.ndarray:
    """Parses regression labels; fails on missing, non-numeric, NaN or infinite ones."""
    check_labels_present(name, values, where)
    numbers, bad = parse_numbers(values)
    if bad.any() or not np.isfinite(numbers).all():
        row = int(np.argmax(bad | ~np.isfinite(numbers)))
        raise InputError(f"label column '{name}' holds {values[row]!r} at {where(row)}: "
                         "regression labels must be finite numbers. Remove or fix that row, "
                         "or choose --head=binary or --head=multiclass.")
    return numbers


def check_labels_present(name: str, values: np.ndarray, where: "Locator") -> None:
    """Fails on the first row without a label."""
    missing = np.isin(np.char.strip(values), ["", "?"])
    if missing.any():
        raise InputError(f"label column '{name}' is empty at {where(int(np.argmax(missing)))}: "
                         "every row needs a label. Remove or fix that row.")


def infer_label(name: str, values: np.ndarray, head: HeadType | None,
                where: "Locator") -> Label:
    """Infers the head from the label values (strings), or checks the head the user chose."""
    check_labels_present(name, values, where)
    numbers, bad = parse_numbers(values)
    if not bad.any() and not np.isfinite(numbers).all():
        regression_targets(name, values, where)  # raises, naming the row
    if head is None:
        if bad.any():
            head = (HeadType.BINARY if len(np.unique(class_names(values))) == 2
                    else HeadType.MULTICLASS)
        else:
            distinct = np.unique(numbers)
            integral = np.all(distinct == np.round(distinct))
            if integral and len(distinct) == 2:
                head = HeadType.BINARY
            elif integral and len(distinct) <= _MAX_INTEGER_CLASSES:
                head = HeadType.MULTICLASS
            else:
                head = HeadType.REGRESSION
    if head is HeadType.REGRESSION:
        numbers = regression_targets(name, values, where)
        return Label(name, head, mean=float(numbers.mean()), std=float(numbers.std()) or 1.0)
    return Label(name, head, classes=tuple(sorted(set(class_names(values)))))


def class_names(values: np.ndarray) -> np.ndarray:
    """Canonical class names: numeric labels 1 and 1.0 are the same class '1'."""
    numbers, bad = parse_numbers(values)
    if bad.any():
        return np.char.strip(values.astype(str))
    return np.array([_format_number(x) for x in numbers])


def _format_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class Locator:
    """Turns a row index into 'file line N' for error messages."""

    def __init__(self, files: Sequence[str], file_starts: Sequence[int],
                 lines: np.ndarray, unit: str = "line"):
        self._files = list(files)
        self._starts = np.asarray(file_starts)
        self._lines = lines
        self._unit = unit

    def __call__(self, row: int) -> str:
        f = int(np.searchsorted(self._starts, row, side="right") - 1)
        return f"{self._files[f]} {self._unit} {int(self._lines[row])}"


def infer_columns(raw: dict[str, np.ndarray], choices: ColumnChoices,
                  where: Locator) -> tuple[Column, ...]:
    """Decides each feature column's kind and computes its statistics from training data."""
    columns = []
    for name, values in raw.items():
        if name == choices.label or name in choices.ignore:
            continue
        if name in choices.categorical:
            columns.append(_categorical(name, values, choices.max_vocabulary_size))
            continue
        numbers, bad = parse_numbers(values)
        if name in choices.numeric or not bad.any():
            if bad.any():
                row = int(np.argmax(bad))
                raise InputError(f"column '{name}' is numeric but holds {values[row]!r} at "
                                 f"{where(row)}. Fix the value, or drop '{name}' from "
                                 "--numeric_columns.")
            columns.append(_numeric(name, numbers, choices.num_bins))
            continue
        present = ~np.isin(np.char.strip(values), list(MISSING_TOKENS))
        share = 1.0 - bad.sum() / max(1, present.sum())
        if share >= _NUMERIC_TYPO_SHARE:
            row = int(np.argmax(bad))
            raise InputError(
                f"column '{name}' looks numeric ({share:.1%} of its values are numbers) but "
                f"holds {values[row]!r} at {where(row)}. Fix the value, or pass "
                f"--categorical_columns={name} to treat the column as categories.")
        columns.append(_categorical(name, values, choices.max_vocabulary_size))
    return tuple(columns)


def _numeric(name: str, numbers: np.ndarray, num_bins: int) -> NumericColumn:
    present = numbers[np.isfinite(numbers)]
    if present.size == 0:
        raise InputError(f"numeric column '{name}' has no values in the training data; drop it "
                         f"with --ignore_columns={name}.")
    std = float(present.std()) or 1.0
    return NumericColumn(name, float(present.mean()), std, quantile_edges(present, num_bins))


def quantile_edges(values: np.ndarray, num_bins: int) -> tuple[float, ...]:
    """Bin edges at the quantiles of `values`, from the minimum to the maximum.

    A column dominated by one value (capital gains: 92% zeros) has few distinct quantiles;
    the quantiles of the other values are added, so that the rest of the range is binned too.
    """
    if num_bins < 1:
        return ()
    levels = np.linspace(0, 1, num_bins + 1)
    edges = [np.quantile(values, levels)]
    distinct, counts = np.unique(values, return_counts=True)
    rest = values[values != distinct[np.argmax(counts)]]
    if len(np.unique(edges[0])) < num_bins + 1 and rest.size:
        edges.append(np.quantile(rest, levels))
    edges = np.unique(np.concatenate(edges))
    return tuple(float(e) for e in edges) if len(edges) > 1 else ()


def _categorical(name: str, values: np.ndarray, max_size: int) -> CategoricalColumn:
    uniques, counts = np.unique(np.char.strip(values.astype(str)), return_counts=True)
    order = np.lexsort((uniques, -counts))[:max_size]
    return CategoricalColumn(name, tuple(str(u) for u in uniques[order]))
