"""Dates and date-times as text: which values are dates, what the scan records of a date column,
and the rules the exported model parses them by (`trainer.input.features` runs the same rules in
TensorFlow ops; the tests hold the two to each other).

A value is read in one of `FORMATS`:
- `iso`: `2024-03-01`, `2024-03-01 09:00`, `2024-03-01T09:00:00.250Z`, `...+05:30`, `...-0800`
  (two-digit month, day, hour and minute; seconds and a fraction optional; a zone optional,
  none meaning UTC);
- `mdy` and `dmy`: `3/1/2024`, `03-01-2024 9:05` (month or day first; `/`, `-` or `.`).
Every value becomes the canonical `YYYY-MM-DDTHH:MM:SS+HHMM` by a few regular-expression
rewrites (`REWRITES`), then fixed-position fields. A value that does not parse, or names no
real day (2023-02-30), is missing, never an error: at serving time too.

What the model gets of a date column (`DateColumn`): the seconds since 1970-01-01 UTC and the
year (each standardised by the training values), the month, day of month, weekday and (where
the training values have times) the time of day as points on circles (sine and cosine: December
is next to January, 23:00 to midnight), and whether the value was missing. The calendar parts
are the clock's as written (local time); the seconds are UTC.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from collections.abc import Iterable, Sequence

FORMATS = ("iso", "mdy", "dmy")
CANONICAL = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[+-]\d{4}"
# A column is taken for dates when at least this share of its non-missing values parse.
DETECT_SHARE = 0.95
# A declared date column (--date_columns) must parse at least this share of its values.
DECLARED_SHARE = 0.5

_DAY_FIRST = r"^(\d{1,2})[/.-](\d{1,2})[/.-](\d{4})(.*)$"
# (pattern, replacement) in RE2 syntax, which Python's re reads the same way ("\1" groups);
# applied in order, each to the previous one's output.
_TO_ISO = {"mdy": [(_DAY_FIRST, r"\3-\1-\2\4")], "dmy": [(_DAY_FIRST, r"\3-\2-\1\4")], "iso": []}
REWRITES = [
    (r"^(\d{4})-(\d)-", r"\1-0\2-"),  # a one-digit month (from mdy/dmy)
    (r"^(\d{4}-\d{2})-(\d)(\D|$)", r"\1-0\2\3"),  # a one-digit day
    (r"^(\d{4}-\d{2}-\d{2})[ T](\d):", r"\1T0\2:"),  # a one-digit hour
    (r"^(\d{4}-\d{2}-\d{2})$", r"\1T00:00:00+0000"),  # a date alone: midnight UTC
    (r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2})(\s*(?:Z|[+-]\d{2}:?\d{2})?)$", r"\1T\2:00\3"),
    (r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.\d+)?\s*(Z|[+-]\d{2}:?\d{2})?$", r"\1T\2\3"),
    (r"^(.{19})$", r"\1+0000"),  # no zone: UTC
    (r"^(.{19})Z$", r"\1+0000"),
    (r"^(.{19}[+-]\d{2}):(\d{2})$", r"\1\2"),
]


def rewrites(fmt: str) -> list[tuple[str, str]]:
    """The rewrites that turn a value of format `fmt` into the canonical form."""
    return _TO_ISO[fmt] + REWRITES


@dataclasses.dataclass(frozen=True)
class Parsed:
    """One date-time: UTC seconds, and the calendar of the clock as written."""

    seconds: float
    year: int
    month: int
    day: int
    weekday: int  # Monday 0
    hour: float  # 0 <= hour < 24, minutes as a fraction


def parse(text: str, fmt: str = "iso") -> Parsed | None:
    """`text` as a date-time of format `fmt`, or None (not a date, or no real day)."""
    value = text.strip()
    for pattern, replacement in rewrites(fmt):
        value = _python_sub(pattern, replacement, text=value)
    if not re.fullmatch(CANONICAL, value):
        return None
    year, month, day = int(value[0:4]), int(value[5:7]), int(value[8:10])
    hour, minute, second = int(value[11:13]), int(value[14:16]), int(value[17:19])
    sign = 1 if value[19] == "+" else -1
    offset = sign * (int(value[20:22]) * 3600 + int(value[22:24]) * 60)
    try:
        day_of = datetime.date(year, month, day)
    except ValueError:
        return None
    if hour > 23 or minute > 59 or second > 60:
        return None
    days = day_of.toordinal() - datetime.date(1970, 1, 1).toordinal()
    return Parsed(
        seconds=float(days * 86400 + hour * 3600 + minute * 60 + second - offset),
        year=year,
        month=month,
        day=day,
        weekday=day_of.weekday(),
        hour=hour + minute / 60,
    )


def _python_sub(pattern: str, replacement: str, *, text: str) -> str:
    return re.sub(pattern, re.sub(r"\\(\d)", r"\\g<\1>", replacement), text)


def has_time(text: str, fmt: str = "iso") -> bool:
    """Whether a value that parses says a time of day (not a date alone)."""
    value = text.strip()
    for pattern, replacement in _TO_ISO[fmt]:
        value = _python_sub(pattern, replacement, text=value)
    return bool(re.search(r"\d[ T]\d{1,2}:\d{2}", value))


def parsed_share(values: Iterable[tuple[str, int]], fmt: str) -> tuple[float, int]:
    """(the share of the counted values that parse as `fmt`, how many were counted)."""
    total = parsed = 0
    for text, count in values:
        total += count
        parsed += count if parse(text, fmt) is not None else 0
    return (parsed / total if total else 0.0), total


def moments(weighted: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """(mean, standard deviation) of values with counts."""
    total = sum(c for _, c in weighted)
    if not total:
        return 0.0, 0.0
    mean = sum(v * c for v, c in weighted) / total
    variance = sum(c * (v - mean) ** 2 for v, c in weighted) / total
    return mean, math.sqrt(variance)
