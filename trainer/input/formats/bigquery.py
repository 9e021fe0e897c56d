"""BigQuery tables as input: `bq://PROJECT.DATASET.TABLE` (or `bq://DATASET.TABLE` in the
job's project), read with the BigQuery Storage Read API in Arrow format.

A table opens as a `Source` whose "files" are the read streams of one read session. The chief
creates the session when it scans the table, and the job dir records it (`Session`); every
other replica, and a chief that resumes, reads the recorded streams. So the streams shard
across workers the way files do (whole streams, or every n-th row of each when there are
fewer streams than readers), and the hold-out and the row counts stay those of the scan.
BigQuery keeps a read session for at most 6 hours: a job resumed after that must start anew.

Column kinds come from the table schema: INT64, FLOAT64, NUMERIC and BIGNUMERIC columns are
numeric, STRING and BOOL categorical, DATE, DATETIME and TIMESTAMP dates (read as ISO text,
`trainer/input/dates.py`; flags override); any other type must be ignored
(`--ignore_columns`). Each stream's Arrow record batches become CSV lines (pyarrow's C++
writer, no Python per row) that the CSV row parser reads: row numbers count from 1 in each
stream, line ends inside strings become spaces, NULL is a missing value.

Cost: one CreateReadSession call when the chief opens the table; each pass over the data
reads each of the reader's streams once (ReadRows; the client resumes a broken stream at its
offset).

A parameter-server worker's dataset cannot run the reader: there the chief stages the table
once, before its scan, as CSV shards `folder/name-<stream>-<part>.csv.gz`
(`trainer/input/formats/shards.py`), the CSV lines the streaming reader parses (so every
value, and each column's kind from the table schema, is what reading the table gives). The
manifest records the read session: a resume reads the shards, never the table (it does not
depend on the 6-hour read session). Staging reads every stream once, `_STAGE_THREADS` at a
time.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import functools
import io
import re
import time

from absl import logging

from trainer.errors import InputError, require
from trainer.input import blocks
from trainer.input.formats import shards
from trainer.input.formats.base import (
    Format,
    Reading,
    Source,
    iso_text,
    with_typed_categorical,
    with_typed_dates,
)
from trainer.input.options import BigQueryConnection, InputOptions
from trainer.input.schema import ColumnChoices
from trainer.storage import files as storage

PREFIX = "bq://"
NUMERIC = frozenset({"INT64", "FLOAT64", "NUMERIC", "BIGNUMERIC"})
CATEGORICAL = frozenset({"STRING", "BOOL"})
TEMPORAL = frozenset({"DATE", "DATETIME", "TIMESTAMP"})
# Streams asked for: the server may return fewer (one for a small table).
MAX_STREAMS = 64
# Streams staged at once: each is a gRPC read, a CSV writer and gzip, which release the GIL.
_STAGE_THREADS = 8
_NAME = re.compile(r"^(?:([a-z][a-z0-9.:-]*[a-z0-9])\.)?([A-Za-z0-9_]+)\.([^.\s/]+)$")


def is_table(data: str | None) -> bool:
    return bool(data) and data.strip().startswith(PREFIX)  # type: ignore[union-attr]


@dataclasses.dataclass(frozen=True)
class Table:
    project: str
    dataset: str
    table: str

    @classmethod
    def parse(cls, uri: str, *, flag: str, default_project: str | None) -> Table:
        require(
            "google.cloud.bigquery_storage_v1",
            distribution="google-cloud-bigquery-storage",
            needed_by=f"{flag}={uri} (a BigQuery table)",
        )
        match = _NAME.match(uri.strip()[len(PREFIX) :])
        if not match:
            raise InputError(
                f"{flag}={uri} is not a BigQuery table: write bq://PROJECT.DATASET.TABLE "
                "(or bq://DATASET.TABLE in the job's project)."
            )
        project, dataset, table = match.groups()
        if not (project or default_project):
            raise InputError(
                f"{flag}={uri} names no project, and CLOUD_ML_PROJECT_ID is not set: "
                "write bq://PROJECT.DATASET.TABLE."
            )
        return cls(project or default_project, dataset, table)  # type: ignore[arg-type]

    @property
    def path(self) -> str:
        """The resource name the Storage Read API takes."""
        return f"projects/{self.project}/datasets/{self.dataset}/tables/{self.table}"

    def __str__(self) -> str:
        return f"{PREFIX}{self.project}.{self.dataset}.{self.table}"


@dataclasses.dataclass(frozen=True)
class Session:
    """A read session as the job dir records it: the table, the session, its Arrow schema
    (to decode the streams' record batches), each column's BigQuery type and when BigQuery
    drops the session (seconds since the epoch; None if the server did not say). The
    connection it is read through is not recorded: each replica has its own."""

    table: str
    name: str
    arrow_schema: bytes
    types: tuple[str, ...]
    expire_time: float | None = None
    connection: BigQueryConnection = dataclasses.field(default=BigQueryConnection(), compare=False)

    def to_json(self) -> dict:
        return {
            "table": self.table,
            "name": self.name,
            "arrow_schema": base64.b64encode(self.arrow_schema).decode("ascii"),
            "types": list(self.types),
            "expire_time": self.expire_time,
        }

    @classmethod
    def from_json(cls, data: dict, connection: BigQueryConnection) -> Session:
        return cls(
            data["table"],
            data["name"],
            base64.b64decode(data["arrow_schema"]),
            tuple(data["types"]),
            data.get("expire_time"),
            connection,
        )


class BigQuery(Format):
    name = "bigquery"
    title = "BigQuery"
    unit = "line"
    in_graph = False
    has_files = False  # read streams: a read session reads one snapshot of the table
    shared_state = True  # the chief's read session

    def claims(self, data: str) -> bool:
        return is_table(data)

    def open(self, pattern, files, *, flag, options: InputOptions, recorded=None) -> Source:
        return open_table(pattern, flag=flag, connection=options.bigquery, recorded=recorded)

    def record(self, source: Source) -> dict | None:
        return recorded_session(source)

    def column_choices(self, source: Source, choices: ColumnChoices) -> ColumnChoices:
        return table_choices(source, choices)

    def reader(self, source: Source, reading: Reading):
        session = source.state

        def chunks(stream: str):
            yield from csv_chunks(stream, session)

        return blocks.python_blocks(chunks), False

    # -- parameter-server clusters ----------------------------------------------------------
    def stage(self, source: Source, *, folder: str, name: str) -> Source:
        session = source.state
        started = shards.start(folder, name)
        header = shards.header(source.columns)

        def one(item: tuple[int, str]) -> list[tuple[str, int]]:
            index, stream = item
            return storage.retry(
                lambda: _write_stream(stream, session, header, f"{folder}/{name}-{index:05d}"),
                what=f"staging {source.pattern} into {folder}",
            )

        threads = max(1, min(_STAGE_THREADS, len(source.files)))
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            written = [
                entry
                for index, stream in enumerate(pool.map(one, enumerate(source.files)))
                for entry in shards.entries(index, stream)
            ]
        if not written:
            raise InputError(f"{source.flag}: BigQuery table {source.pattern} holds no rows.")
        manifest = {
            "format": self.name,
            "table": session.table,
            "session": session.to_json(),
            "columns": list(source.columns),
            "files": written,
        }
        shards.publish(folder, name, manifest, what=source.pattern, started=started)
        return shards.source(
            self, flag=source.flag, pattern=source.pattern, manifest=manifest, state=session
        )

    def reuse_staged(self, pattern, files, *, flag, options, folder, name) -> Source | None:
        """A staging of the same table (no read session is created)."""
        manifest = shards.read_manifest(folder, name)
        if manifest is None:
            return None
        table = Table.parse(pattern, flag=flag, default_project=options.bigquery.project)
        if manifest.get("table") != str(table) or not shards.has_origins(manifest):
            return None  # another table's (or an older version's): staged anew
        logging.info(
            "%s: reusing the %d shards staged in %s.", pattern, len(manifest["files"]), folder
        )
        return self.open_staged(pattern, flag=flag, options=options, manifest=manifest)

    def open_staged(self, pattern, *, flag, options, manifest) -> Source:
        table = Table.parse(pattern, flag=flag, default_project=options.bigquery.project)
        session = Session.from_json(manifest["session"], options.bigquery)
        if session.table != str(table):
            raise InputError(
                f"{flag}={pattern}, but the job in this --job_dir reads {session.table}. Resume "
                "with the same table, or train on this one in a new --job_dir."
            )
        return shards.source(self, flag=flag, pattern=pattern, manifest=manifest, state=session)


# -- opening ----------------------------------------------------------------------------------
def open_table(
    uri: str, *, flag: str, connection: BigQueryConnection, recorded: dict | None = None
) -> Source:
    """The table's `Source`: the streams of a new read session, or of the `recorded` one
    (`recorded_session`) of the job this replica belongs to. Fails with InputError naming the
    table when it does not exist, cannot be read, or holds no rows."""
    table = Table.parse(uri, flag=flag, default_project=connection.project)
    if recorded:
        session = Session.from_json(recorded, connection)
        if session.table != str(table):
            raise InputError(
                f"{flag}={uri}, but the job in this --job_dir reads {session.table}. Resume "
                "with the same table, or train on this one in a new --job_dir."
            )
        if session.expire_time is not None and time.time() > session.expire_time:
            raise InputError(
                f"{flag}: the read session of {table} this job started with expired at "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(session.expire_time))} "
                "(BigQuery keeps one for at most 6 hours). Train in a new --job_dir."
            )
        streams = tuple(recorded["streams"])
    else:
        session, streams = _create_session(table, flag=flag, connection=connection)
    schema = _arrow_schema(session.arrow_schema)
    return Source(flag, uri, streams, BIGQUERY, tuple(schema.names), state=session)


def _create_session(
    table: Table, *, flag: str, connection: BigQueryConnection
) -> tuple[Session, tuple[str, ...]]:
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud.bigquery_storage_v1 import types

    parent = f"projects/{connection.project or table.project}"
    request = types.ReadSession(table=table.path, data_format=types.DataFormat.ARROW)
    try:
        session = _client(connection).create_read_session(
            parent=parent, read_session=request, max_stream_count=MAX_STREAMS
        )
    except exceptions.NotFound as e:
        raise InputError(
            f"{flag}: BigQuery table {table} was not found ({_first_line(e)}). Check the "
            "project, dataset and table names."
        ) from None
    except (exceptions.Forbidden, exceptions.PermissionDenied, exceptions.Unauthorized) as e:
        raise InputError(
            f"{flag}: no permission to read BigQuery table {table} ({_first_line(e)}). The "
            f"job's service account needs roles/bigquery.readSessionUser on {parent} and "
            "roles/bigquery.dataViewer on the table."
        ) from None
    except exceptions.GoogleAPICallError as e:
        raise InputError(
            f"{flag}: cannot read BigQuery table {table}: {type(e).__name__}: {_first_line(e)}"
        ) from None
    except auth_exceptions.DefaultCredentialsError as e:
        raise InputError(
            f"{flag}: no Google credentials to read {table} ({e}). Run `gcloud auth "
            "application-default login`, or run on Vertex AI."
        ) from None
    if not session.streams:
        raise InputError(f"{flag}: BigQuery table {table} holds no rows.")
    schema = _arrow_schema(session.arrow_schema.serialized_schema)
    expire = session.expire_time
    return (
        Session(
            str(table),
            session.name,
            bytes(session.arrow_schema.serialized_schema),
            tuple(_bigquery_type(field) for field in schema),
            expire.timestamp() if expire and expire.timestamp() > 0 else None,
            connection,
        ),
        tuple(stream.name for stream in session.streams),
    )


def _first_line(error) -> str:
    return str(getattr(error, "message", error)).strip().splitlines()[0][:300]


@functools.cache
def _client(connection: BigQueryConnection):
    """One Storage Read client per process and connection (its gRPC channel is shared by
    every thread that reads)."""
    from google.cloud import bigquery_storage_v1

    if connection.emulator_host:
        import grpc
        from google.cloud.bigquery_storage_v1.services.big_query_read.transports import (
            BigQueryReadGrpcTransport,
        )

        channel = grpc.insecure_channel(connection.emulator_host)
        return bigquery_storage_v1.BigQueryReadClient(
            transport=BigQueryReadGrpcTransport(channel=channel)
        )
    return bigquery_storage_v1.BigQueryReadClient()


def _arrow_schema(serialized: bytes):
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(serialized))


def _bigquery_type(field) -> str:
    """The BigQuery type a column of the Storage Read API's Arrow schema has."""
    import pyarrow as pa

    kind = field.type
    extension = (field.metadata or {}).get(b"ARROW:extension:name", b"").decode()
    if extension.startswith("google:sqlType:"):  # JSON, GEOGRAPHY: strings with a tag
        return extension.removeprefix("google:sqlType:").upper()
    for test, name in (
        (pa.types.is_integer, "INT64"),
        (pa.types.is_floating, "FLOAT64"),
        (pa.types.is_decimal128, "NUMERIC"),
        (pa.types.is_decimal256, "BIGNUMERIC"),
        (pa.types.is_string, "STRING"),
        (pa.types.is_large_string, "STRING"),
        (pa.types.is_boolean, "BOOL"),
        (pa.types.is_binary, "BYTES"),
        (pa.types.is_date, "DATE"),
        (pa.types.is_time, "TIME"),
        (pa.types.is_list, "ARRAY"),
        (pa.types.is_struct, "STRUCT"),
    ):
        if test(kind):
            return name
    if pa.types.is_timestamp(kind):
        return "TIMESTAMP" if kind.tz else "DATETIME"
    return str(kind).upper()


def recorded_session(source: Source) -> dict:
    """What the job dir keeps of a BigQuery source to read the same streams again."""
    assert isinstance(source.state, Session), "a BigQuery source"
    return dict(source.state.to_json(), streams=list(source.files))


# -- columns ----------------------------------------------------------------------------------
def table_choices(source: Source, choices: ColumnChoices) -> ColumnChoices:
    """`choices` with the table's STRING and BOOL columns categorical (unless named numeric);
    fails naming each used column whose type the trainer cannot read."""
    assert isinstance(source.state, Session), "a BigQuery source"
    types = dict(zip(source.columns, source.state.types))
    unusable = {
        name: kind
        for name, kind in types.items()
        if kind not in NUMERIC | CATEGORICAL | TEMPORAL and name not in choices.ignore
    }
    if unusable:
        listed = ", ".join(f"{n} ({k})" for n, k in unusable.items())
        raise InputError(
            f"{source.flag}: column(s) {listed} of {source.pattern} have types the trainer "
            "cannot read (INT64, FLOAT64, NUMERIC, BIGNUMERIC, STRING, BOOL, DATE, DATETIME, "
            "TIMESTAMP). Pass "
            f"--ignore_columns={','.join(unusable)}, or cast them in a view."
        )
    choices = with_typed_dates(choices, (n for n, k in types.items() if k in TEMPORAL))
    return with_typed_categorical(choices, (n for n, k in types.items() if k in CATEGORICAL))


# -- reading ----------------------------------------------------------------------------------
def record_batches(stream: str, session: Session):
    """The Arrow record batches of one read stream, in order (empty ones skipped)."""
    import pyarrow as pa

    schema = _arrow_schema(session.arrow_schema)
    for response in _client(session.connection).read_rows(stream):
        batch = pa.ipc.read_record_batch(
            pa.py_buffer(response.arrow_record_batch.serialized_record_batch), schema
        )
        if batch.num_rows:
            yield batch


def csv_chunks(stream: str, session: Session):
    """(CSV lines of a ReadRows response, the number of its first row) for one stream: the
    columns of the schema in order, unreadable types (ignored columns) left empty."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv

    schema = _arrow_schema(session.arrow_schema)
    options = pa_csv.WriteOptions(include_header=False)
    row = 1
    for batch in record_batches(stream, session):
        columns = []
        for array, kind in zip(batch.columns, session.types):
            if kind in ("NUMERIC", "BIGNUMERIC"):
                array = pc.cast(array, pa.float64())
            elif kind == "STRING":  # one row per line
                array = pc.replace_substring_regex(array, r"[\r\n]", " ")
            elif kind in TEMPORAL:
                array = iso_text(array)
            elif kind not in NUMERIC | CATEGORICAL:
                array = pa.nulls(len(array), pa.string())
            columns.append(array)
        sink = io.BytesIO()
        pa_csv.write_csv(pa.RecordBatch.from_arrays(columns, names=schema.names), sink, options)
        yield sink.getvalue().removesuffix(b"\n"), row
        row += batch.num_rows


def rows(stream: str, session: Session):
    """One read stream's rows as dicts of JSON values, each column's value as training reads
    it (NUMERIC as a float, a line end in a STRING as a space, BOOL as "true" or "false"),
    other types as text (an ISO date, base64 bytes): what batch prediction sends a model
    trained on the table, and the key it writes back."""
    for batch in record_batches(stream, session):
        for record in batch.to_pylist():
            yield {
                name: _json_value(value, kind)
                for (name, value), kind in zip(record.items(), session.types)
            }


def _json_value(value, kind: str):
    if value is None:
        return None
    if kind in ("NUMERIC", "BIGNUMERIC"):
        return float(value)
    if kind == "STRING":
        return re.sub(r"[\r\n]", " ", value)
    if kind == "BOOL":
        return "true" if value else "false"
    if kind in NUMERIC:
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _write_stream(stream: str, session: Session, header: bytes, prefix: str):
    """Writes one read stream as shards `prefix-0000.csv.gz`, ...; returns (path, rows) of
    each."""
    return shards.write_chunks((lines for lines, _ in csv_chunks(stream, session)), header, prefix)


BIGQUERY = BigQuery()
