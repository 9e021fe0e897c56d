"""How the input is read: what a bad row does, the memory budget for keeping the training data
in memory, the shuffle buffer, and the splits users choose (`trainer/input/splits.py`). A leaf: no
TensorFlow here."""

from __future__ import annotations

import dataclasses
import enum
import math

from trainer.errors import InputError


@dataclasses.dataclass(frozen=True)
class BigQueryConnection:
    """How `bq://` tables are reached (trainer/input/bigquery.py). `project`: the project read
    sessions are created in (the job's, `CLOUD_ML_PROJECT_ID`), and the table's project when
    a URI names none. `emulator_host`: `HOST:PORT` of a Storage Read API emulator, spoken to
    over plain gRPC without credentials (`BIGQUERY_STORAGE_EMULATOR_HOST`); None: Google's
    endpoint with the application default credentials."""

    project: str | None = None
    emulator_host: str | None = None


class BadRows(str, enum.Enum):
    """What a row that cannot be used does: stop the job before training, or get skipped."""

    ERROR = "error"
    SKIP = "skip"


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """`cache_mb`: a reader keeps its encoded training rows in memory when they fit in this
    many MB (else it streams them from the files every epoch). `shuffle_buffer`: rows shuffled
    together when streaming. `format`: every input file is read in this format (a name of
    `trainer/input/formats/registry.py`: "csv", "jsonl", "parquet", ...), whatever its name;
    None: each file in the format its name says. `jsonl`: `format="jsonl"`, as a Vertex AI
    managed dataset in `AIP_DATA_FORMAT=jsonl` is read."""

    bad_rows: BadRows = BadRows.ERROR
    cache_mb: float = 256.0
    shuffle_buffer: int = 65_536
    bigquery: BigQueryConnection = BigQueryConnection()
    jsonl: bool = False
    format: str | None = None

    def __post_init__(self):
        if self.cache_mb < 0:
            raise InputError(f"--cache_mb ({self.cache_mb}) must be >= 0 (0: always stream).")
        if self.shuffle_buffer < 1:
            raise InputError(f"--shuffle_buffer ({self.shuffle_buffer}) must be >= 1.")

    @property
    def data_format(self) -> str | None:
        """The format every input file is read in (None: each file's by its name)."""
        return self.format or ("jsonl" if self.jsonl else None)

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * (1 << 20))


@dataclasses.dataclass(frozen=True)
class SplitOptions:
    """`column`: the predefined split column; `timestamp_column`: the time split's; at most
    one. `fractions`: the time split's train, validate and test shares."""

    column: str | None = None
    timestamp_column: str | None = None
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    source: str | None = None  # the --train_data split (the job reads the split files)

    def __post_init__(self):
        if self.column and self.timestamp_column:
            raise InputError(
                "--split_column and --timestamp_split_column are exclusive: choose the rows' "
                "own split, or a split by time."
            )
        if len(self.fractions) != 3 or any(f < 0 for f in self.fractions):
            raise InputError(
                f"--split_fractions={','.join(map(str, self.fractions))}: give three shares "
                ">= 0 (train, validate, test), e.g. 0.8,0.1,0.1."
            )
        if not math.isclose(sum(self.fractions), 1.0, abs_tol=1e-6) or not all(self.fractions):
            raise InputError(
                f"--split_fractions={','.join(map(str, self.fractions))} must sum to 1, each "
                "share above 0 (the job trains, evaluates and tests on its own rows)."
            )

    @property
    def enabled(self) -> bool:
        return bool(self.column or self.timestamp_column)

    @property
    def split_by(self) -> str:
        return self.column or self.timestamp_column or ""

    def fingerprint(self) -> dict:
        if not self.enabled:
            return {}
        by = (
            {"split_column": self.column}
            if self.column
            else {
                "timestamp_split_column": self.timestamp_column,
                "split_fractions": list(self.fractions),
            }
        )
        return {**by, "split_data": self.source}
