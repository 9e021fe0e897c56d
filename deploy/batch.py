"""Batch prediction: a Vertex AI BatchPredictionJob, or its local twin that reads the same
inputs and writes the same output layout, so notebooks can use either.

    python -m deploy.batch vertex --project=P --model=123 \\
        --source='gs://B/in/*.jsonl' --output_prefix=gs://B/out --instances_format=jsonl
    python -m deploy.batch vertex --project=P --model=123 \\
        --source='gs://B/in/*.csv.gz' --output_prefix=gs://B/out --instances_format=csv \\
        --excluded_fields=income_bracket
    python -m deploy.batch local --model_dir=runs/job/model \\
        --source=data/test.csv --output_prefix=out --instances_format=csv \\
        --excluded_fields=income_bracket

Output: `OUTPUT_PREFIX/prediction-<model>-<time>/prediction.results-0000N-of-0000M`, one
`{"instance": ..., "prediction": ...}` per line, and `prediction.errors_stats-00000-of-00001`,
one `{"instance": ..., "error": {"code": 3, "message": ...}}` per bad line (its file and line
number in the message). A bad line never stops the others. Each file appears whole.

Inputs: `jsonl` (one JSON object per line) or `csv` (a header row, then rows; numbers parsed by
the model's input types). The local twin reads `.gz` files too and drops `--excluded_fields`
(Vertex's `instanceConfig.excludedFields`). For a Vertex job, CSV files (`.gz` too) are first
converted here to JSON objects in `OUTPUT_PREFIX/instances-<time>/*.jsonl`, `--excluded_fields`
dropped, and the job reads those (Vertex would send CSV rows as arrays, which named inputs do
not take); rows that do not fit the model are listed in `conversion.errors_stats` there.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import json
import sys
import time
from typing import Iterator, Sequence

from deploy import api, storage
from deploy.instances import Fields, InstanceError, Predictor

FORMATS = ("jsonl", "csv")
INVALID_ARGUMENT = 3  # google.rpc.Code, as Vertex writes it in errors_stats


# Vertex AI BatchPredictionJob ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class VertexBatchJob:
    """A BatchPredictionJob over files in a bucket; `request()` is its REST request."""

    display_name: str
    model: str
    sources: tuple[str, ...]
    output_prefix: str
    instances_format: str = "jsonl"
    machine_type: str = "n2-standard-4"
    starting_replica_count: int = 1
    max_replica_count: int = 1

    def __post_init__(self):
        _check_format(self.instances_format)
        if not self.sources:
            raise api.DeployError("--source is empty: give gs:// files or globs.")
        for source in self.sources:
            api.gcs_uri("--source", source)
        api.gcs_uri("--output_prefix", self.output_prefix)
        api.positive("--starting_replica_count", self.starting_replica_count)
        api.positive("--max_replica_count", self.max_replica_count)
        if self.max_replica_count < self.starting_replica_count:
            raise api.DeployError(f"--max_replica_count ({self.max_replica_count}) is below "
                                  f"--starting_replica_count ({self.starting_replica_count}).")

    def body(self, cloud: api.Cloud) -> dict:
        return {
            "displayName": self.display_name,
            "model": cloud.resource("models", self.model),
            "inputConfig": {"instancesFormat": self.instances_format,
                            "gcsSource": {"uris": list(self.sources)}},
            "outputConfig": {"predictionsFormat": "jsonl",
                             "gcsDestination": {"outputUriPrefix": self.output_prefix}},
            "dedicatedResources": {"machineSpec": {"machineType": self.machine_type},
                                   "startingReplicaCount": self.starting_replica_count,
                                   "maxReplicaCount": self.max_replica_count},
            "manualBatchTuningParameters": {},  # what the SDK sends: the service's default
        }

    def request(self, cloud: api.Cloud) -> api.ApiRequest:
        return api.ApiRequest("POST", cloud.url(f"{cloud.parent}/batchPredictionJobs"),
                              self.body(cloud))


def submit_vertex(cloud: api.Cloud, job: VertexBatchJob):
    """Creates the BatchPredictionJob and returns at once (the SDK's job object). A job over
    CSV sources goes through `CsvVertexJob` instead (their rows converted first)."""
    from google.cloud import aiplatform

    if job.instances_format == "csv":
        raise api.DeployError("Vertex sends CSV rows to the model as arrays, which its named "
                              "inputs do not take: convert them first (CsvVertexJob).")
    cloud.init_sdk()
    return aiplatform.BatchPredictionJob.submit(
        job_display_name=job.display_name, model_name=cloud.resource("models", job.model),
        instances_format=job.instances_format, predictions_format="jsonl",
        gcs_source=list(job.sources), gcs_destination_prefix=job.output_prefix,
        machine_type=job.machine_type, starting_replica_count=job.starting_replica_count,
        max_replica_count=job.max_replica_count)


# Local twin ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Line:
    """One input line: where it came from and its instance, or why it has none."""

    where: str
    instance: object = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What a local batch prediction wrote."""

    output_dir: str
    result_files: tuple[str, ...]
    error_file: str
    num_predictions: int
    num_errors: int
    seconds: float


def predict_local(*, model_dir: str, sources: Sequence[str], output_prefix: str,
                  instances_format: str = "jsonl", excluded_fields: Sequence[str] = (),
                  model_name: str = "model", batch_size: int = 256, num_shards: int = 1,
                  predictor: Predictor | None = None) -> BatchResult:
    """Predicts every line of `sources` (local or gs:// files or globs) with the model in
    `model_dir` and writes Vertex's output layout under `output_prefix`.

    Example:
        result = predict_local(model_dir="runs/job/model", sources=["test.csv"],
                               output_prefix="out", instances_format="csv",
                               excluded_fields=["income_bracket"])
    """
    _check_format(instances_format)
    api.positive("batch_size", batch_size)
    api.positive("num_shards", num_shards)
    files = storage.expand(list(sources))
    started = time.perf_counter()
    predictor = predictor or Predictor(model_dir)
    excluded = frozenset(excluded_fields)
    results, errors = [], []
    for chunk in _chunks(_lines(files, instances_format, predictor.fields, excluded),
                          batch_size):
        good = [line for line in chunk if line.error is None]
        errors.extend(_error_record(line) for line in chunk if line.error is not None)
        ok, failed = _predict_lines(predictor, good)
        results.extend(ok)
        errors.extend(failed)
    output_dir = f"{output_prefix.rstrip('/')}/prediction-{model_name}-{_timestamp()}"
    result_files = _write_shards(output_dir, "prediction.results", results, num_shards)
    (error_file,) = _write_shards(output_dir, "prediction.errors_stats", errors, 1)
    return BatchResult(output_dir, tuple(result_files), error_file, len(results), len(errors),
                       time.perf_counter() - started)


def _check_format(instances_format: str) -> None:
    if instances_format not in FORMATS:
        raise api.DeployError(f"--instances_format ({instances_format!r}) must be one of "
                              f"{', '.join(FORMATS)}.")


def _lines(files: list[str], instances_format: str, fields: Fields,
           excluded: frozenset) -> Iterator[Line]:
    """Every data line of every file, checked against the model's inputs."""
    typed = instances_format == "jsonl"
    for path in files:
        text = _read_text(path)
        records = _jsonl_lines(path, text) if typed else _csv_lines(path, text)[1]
        yield from _checked_lines(records, fields, excluded, typed=typed)


def _read_text(path: str) -> str:
    return storage.read_bytes(path).decode("utf-8-sig", errors="replace")


def _jsonl_lines(path: str, text: str):
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield f"{path}:{number}", json.loads(raw), None
        except json.JSONDecodeError as e:
            yield f"{path}:{number}", raw, f"not JSON ({e})"


def _csv_lines(path: str, text: str) -> tuple[list[str], Iterator]:
    """The header row, and (where, row, error) for each data row."""
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True)
    header = [h.strip() for h in next(reader, [])]
    return header, _csv_rows(path, header, reader)


def _csv_rows(path: str, header: list[str], reader):
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            yield where, row, (f"{len(row)} fields, the header has {len(header)} (quote values "
                               "that contain commas)")
        else:
            yield where, dict(zip(header, row)), None


def _checked_lines(records, fields: Fields, excluded: frozenset, *, typed: bool
                   ) -> Iterator[Line]:
    """(where, instance, error) records as Lines: instances checked (`typed`, from JSON) or
    typed from text (from CSV) by the model's fields, `excluded` fields dropped first."""
    for where, instance, error in records:
        if error is None:
            instance, error = _checked(fields, instance, excluded, typed=typed)
        yield Line(where, instance, error)


def _checked(fields: Fields, instance, excluded: frozenset, *, typed: bool):
    """(instance ready for the model, None) or (the instance as read, the reason)."""
    if excluded and isinstance(instance, dict):
        instance = {k: v for k, v in instance.items() if k not in excluded}
    try:
        if typed:
            return fields.check(0, instance), None
        return fields.from_text(0, instance), None
    except InstanceError as e:
        return instance, e.reason


def _predict_lines(predictor: Predictor, lines: list[Line]) -> tuple[list, list]:
    """Result records, and error records for lines the model itself failed on (a failing
    batch is retried one line at a time so that one bad line does not take the rest)."""
    if not lines:
        return [], []
    try:
        predictions = predictor.predict_checked([line.instance for line in lines])
    except Exception as e:  # noqa: BLE001 (a model failure is reported per line)
        if len(lines) == 1:
            return [], [_error_record(dataclasses.replace(
                lines[0], error=f"prediction failed: {type(e).__name__}: {e}"))]
        ok, failed = [], []
        for line in lines:
            one_ok, one_failed = _predict_lines(predictor, [line])
            ok += one_ok
            failed += one_failed
        return ok, failed
    return [{"instance": line.instance, "prediction": p}
            for line, p in zip(lines, predictions)], []


def _error_record(line: Line) -> dict:
    return {"instance": line.instance,
            "error": {"code": INVALID_ARGUMENT, "message": f"{line.where}: {line.error}"}}


def _chunks(lines: Iterator[Line], size: int) -> Iterator[list[Line]]:
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _timestamp() -> str:
    """Vertex's directory timestamp: 2026_11_22T00_23_28_776Z."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y_%m_%dT%H_%M_%S_") + f"{now.microsecond // 1000:03d}Z"


def _write_shards(output_dir: str, stem: str, records: list, num_shards: int) -> list[str]:
    """Records split into `num_shards` contiguous files, each written whole."""
    paths = []
    per_shard = -(-len(records) // num_shards) if records else 0
    for shard in range(num_shards):
        part = records[shard * per_shard:(shard + 1) * per_shard]
        path = f"{output_dir}/{stem}-{shard:05d}-of-{num_shards:05d}"
        storage.write_bytes(path, _jsonl_bytes(part))
        paths.append(path)
    return paths


def _jsonl_bytes(records: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def read_results(output_dir: str) -> tuple[list[dict], list[dict]]:
    """(result records, error records) of a batch prediction output directory."""
    results = _read_records(f"{output_dir}/prediction.results-*")
    errors = _read_records(f"{output_dir}/prediction.errors_stats-*")
    return results, errors


def _read_records(pattern: str) -> list[dict]:
    try:
        files = storage.expand([pattern])
    except FileNotFoundError:
        return []
    return [json.loads(line) for f in files
            for line in storage.read_bytes(f).decode().splitlines() if line]


# CSV sources for a Vertex job ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CsvVertexJob:
    """A Vertex job over CSV sources, run over JSON Lines converted from them.

    Vertex would send each CSV row to the model as an array, which a signature with one named
    input per column does not take. So before the job is created, each CSV file (header row
    first, may be `.gz`) becomes `instances_dir/NNNNN-NAME.jsonl`: one object per row, keyed by
    the header and typed by the model's inputs as the local twin types them, without
    `excluded_fields`. A row that does not fit is never sent: it goes to
    `instances_dir/conversion.errors_stats` (records like Vertex's errors_stats, with file and
    line) and is counted. The job then reads `instances_dir/*.jsonl`.

    Example:
        csv_job = CsvVertexJob.of(VertexBatchJob(
            display_name="census", model="123", sources=("gs://b/in/*.csv",),
            output_prefix="gs://b/out", instances_format="csv"),
            excluded_fields=["income_bracket"])
        conversion, created = submit_vertex_csv(cloud, csv_job)
    """

    job: VertexBatchJob
    instances_dir: str
    excluded_fields: tuple[str, ...] = ()
    # The SavedModel whose inputs type the rows; default: the registered model's artifactUri.
    model_dir: str | None = None

    def __post_init__(self):
        if self.job.instances_format != "csv":
            raise api.DeployError(f"CsvVertexJob needs a csv job, got instances_format "
                                  f"{self.job.instances_format!r}.")
        api.gcs_uri("instances_dir", self.instances_dir)

    @classmethod
    def of(cls, job: VertexBatchJob, *, excluded_fields: Sequence[str] = (),
           model_dir: str | None = None) -> "CsvVertexJob":
        """`job` with its CSV converted under OUTPUT_PREFIX/instances-<time>/."""
        instances_dir = f"{job.output_prefix.rstrip('/')}/instances-{_timestamp()}"
        return cls(job, instances_dir, tuple(excluded_fields), model_dir)

    @property
    def jsonl_job(self) -> VertexBatchJob:
        """The job Vertex runs: over the converted files."""
        return dataclasses.replace(self.job, sources=(f"{self.instances_dir}/*.jsonl",),
                                   instances_format="jsonl")

    @property
    def error_file(self) -> str:
        return f"{self.instances_dir}/conversion.errors_stats"

    def jsonl_file(self, index: int, source: str) -> str:
        """The converted file of the `index`-th source file."""
        name = source.rsplit("/", 1)[-1].removesuffix(".gz").removesuffix(".csv")
        return f"{self.instances_dir}/{index:05d}-{name}.jsonl"

    def requests(self, cloud: api.Cloud) -> list[api.ApiRequest]:
        """What is sent: a GET on the model for its artifactUri (unless `model_dir` is given),
        then the job."""
        get_model = [] if self.model_dir else [
            api.ApiRequest("GET", cloud.url(cloud.resource("models", self.job.model)))]
        return [*get_model, self.jsonl_job.request(cloud)]

    def plan(self) -> str:
        """The files the conversion writes, in words (what --dry_run says)."""
        return (f"would convert each CSV file of {', '.join(self.job.sources)} to "
                f"{self.instances_dir}/NNNNN-NAME.jsonl (its index and name), one JSON object "
                f"per row, and list the rows that do not fit the model in {self.error_file}")


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What `convert_csv` wrote."""

    instances_dir: str
    files: tuple[str, ...]
    error_file: str
    num_rows: int
    num_errors: int

    def summary(self) -> str:
        return (f"CSV to JSON Lines: {self.num_rows} rows converted, {self.num_errors} rows "
                f"with errors (listed in {self.error_file}); {len(self.files)} .jsonl file(s) "
                f"in {self.instances_dir}/")


def model_fields(cloud: api.Cloud, model: str, model_dir: str | None = None) -> Fields:
    """The input fields of the SavedModel in `model_dir` (local or gs://), or else in the
    registered model's artifactUri (one GET through the SDK)."""
    if model_dir is not None:
        return _fields_at(model_dir, f"--model_dir ({model_dir!r})")
    from google.cloud import aiplatform

    cloud.init_sdk()
    artifact_uri = aiplatform.Model(cloud.resource("models", model)).uri
    if not artifact_uri:
        raise api.DeployError(f"model {model} has no artifactUri; pass --model_dir, the "
                              "exported model.")
    return _fields_at(artifact_uri, f"the artifactUri of model {model} ({artifact_uri!r})")


def _fields_at(model_dir: str, what: str) -> Fields:
    try:
        return Predictor(model_dir).fields
    except OSError as e:
        raise api.DeployError(f"{what} holds no SavedModel: {e}") from None


def convert_csv(csv_job: CsvVertexJob, fields: Fields) -> Conversion:
    """Writes the job's CSV rows as JSON Lines objects typed by `fields` (see CsvVertexJob).

    Cost: reads every source and holds its converted rows in memory, so that a file whose
    header does not fit the model, or sources where no row fits, stop everything (DeployError)
    before a file is written. A file with no row that fits gets no .jsonl file.
    """
    excluded = frozenset(csv_job.excluded_fields)
    converted, errors = {}, []
    for index, path in enumerate(storage.expand(list(csv_job.job.sources))):
        header, records = _csv_lines(path, _read_text(path))
        _check_header(path, header, fields, excluded)
        rows = []
        for line in _checked_lines(records, fields, excluded, typed=False):
            if line.error is None:
                rows.append(line.instance)
            else:
                errors.append(_error_record(line))
        if rows:
            converted[csv_job.jsonl_file(index, path)] = rows
    num_rows = sum(map(len, converted.values()))
    if not num_rows:
        first = errors[0]["error"]["message"] if errors else "the files hold only a header"
        raise api.DeployError(f"no CSV row of {', '.join(csv_job.job.sources)} fits the "
                              f"model ({first}).")
    for path, rows in converted.items():
        storage.write_bytes(path, _jsonl_bytes(rows))
    storage.write_bytes(csv_job.error_file, _jsonl_bytes(errors))
    return Conversion(csv_job.instances_dir, tuple(converted), csv_job.error_file, num_rows,
                      len(errors))


def submit_vertex_csv(cloud: api.Cloud, csv_job: CsvVertexJob):
    """Converts the job's CSV rows (see CsvVertexJob), then creates the job over the converted
    files and returns at once: (the Conversion, the SDK's job object). Bad input raises
    DeployError before anything is written or created."""
    fields = model_fields(cloud, csv_job.job.model, csv_job.model_dir)
    conversion = convert_csv(csv_job, fields)
    return conversion, submit_vertex(cloud, csv_job.jsonl_job)


def _check_header(path: str, header: list[str], fields: Fields, excluded: frozenset) -> None:
    """Fails naming the file and the columns when its header cannot fit the model."""
    expected = ", ".join(fields.kinds)
    if not header:
        raise api.DeployError(f"{path} is empty: it needs a header row naming the model's "
                              f"columns ({expected}), then rows.")
    columns = set(header) - excluded
    missing = [name for name in fields.kinds if name not in columns]
    if len(missing) == len(fields.kinds):
        raise api.DeployError(f"{path}: the first line ({','.join(header)}) names none of the "
                              f"model's columns; it must be a header row naming them: "
                              f"{expected}.")
    if missing:
        dropped = " once --excluded_fields are dropped" if excluded & set(missing) else ""
        raise api.DeployError(f"{path}: the header has no column {', '.join(missing)}"
                              f"{dropped}; the model takes {expected}.")
    unknown = [name for name in header if name in columns and name not in fields.kinds]
    if unknown:
        raise api.DeployError(f"{path}: the header names {', '.join(unknown)}, which the model "
                              f"does not take; drop it with --excluded_fields="
                              f"{','.join(unknown)}.")


# Command line ----------------------------------------------------------------------------

def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    vertex = commands.add_parser("vertex", help="Create a Vertex AI BatchPredictionJob.")
    api.add_cloud_flags(vertex)
    vertex.add_argument("--model", required=True, help="Model id or resource name.")
    vertex.add_argument("--model_dir", default=None,
                        help="csv: the exported model whose inputs type the rows (default: the "
                        "model's artifactUri).")
    vertex.add_argument("--display_name", default="adanet-batch-prediction")
    vertex.add_argument("--machine_type", default="n2-standard-4")
    vertex.add_argument("--starting_replica_count", type=int, default=1)
    vertex.add_argument("--max_replica_count", type=int, default=1)
    local = commands.add_parser("local", help="Predict here, writing the same layout.")
    local.add_argument("--model_dir", required=True, help="The exported model (JOB_DIR/model).")
    local.add_argument("--batch_size", type=int, default=256)
    local.add_argument("--num_shards", type=int, default=1)
    local.add_argument("--model_name", default="model", help="Names the output directory.")
    for command in (vertex, local):
        command.add_argument("--source", required=True,
                             help="Comma-separated files or globs (gs:// or local).")
        command.add_argument("--output_prefix", required=True, help="Where outputs go.")
        command.add_argument("--instances_format", default="jsonl", choices=FORMATS)
        command.add_argument("--excluded_fields", default="",
                             help="Comma-separated columns to drop from each instance (a "
                             "label); for a Vertex job, csv only.")
    args = p.parse_args(argv)
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    excluded = [f.strip() for f in args.excluded_fields.split(",") if f.strip()]
    if args.command == "vertex":
        return _run_vertex(args, sources, excluded)
    result = predict_local(
        model_dir=args.model_dir, sources=sources, output_prefix=args.output_prefix,
        instances_format=args.instances_format, model_name=args.model_name,
        excluded_fields=excluded, batch_size=args.batch_size, num_shards=args.num_shards)
    print(json.dumps(dataclasses.asdict(result), indent=2))
    return 0


def _run_vertex(args, sources: list[str], excluded: list[str]) -> int:
    cloud = api.cloud_from(args)
    job = VertexBatchJob(display_name=args.display_name, model=args.model,
                         sources=tuple(sources), output_prefix=args.output_prefix,
                         instances_format=args.instances_format,
                         machine_type=args.machine_type,
                         starting_replica_count=args.starting_replica_count,
                         max_replica_count=args.max_replica_count)
    if job.instances_format == "csv":
        csv_job = CsvVertexJob.of(job, excluded_fields=excluded, model_dir=args.model_dir)
        return _run_vertex_csv(cloud, csv_job, args.dry_run)
    if excluded or args.model_dir:
        raise api.DeployError("--excluded_fields and --model_dir apply to csv sources; "
                              "jsonl instances go to the model as they are.")
    if args.dry_run:
        api.show([job.request(cloud)])
        return 0
    print(submit_vertex(cloud, job).resource_name)
    return 0


def _run_vertex_csv(cloud: api.Cloud, csv_job: CsvVertexJob, dry_run: bool) -> int:
    if dry_run:
        api.show(csv_job.requests(cloud))
        print(f"dry run: {csv_job.plan()}. Nothing was read, written or sent.",
              file=sys.stderr)
        return 0
    conversion, created = submit_vertex_csv(cloud, csv_job)
    print(conversion.summary(), file=sys.stderr)
    print(created.resource_name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
