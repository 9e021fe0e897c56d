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
number in the message). A bad line never stops the others.

Inputs: `jsonl` (one JSON object per line) or `csv` (a header row, then rows; numbers parsed by
the model's input types). The local twin (`deploy/batch_local.py`) streams them in constant
memory, reads `.gz` files too and drops `--excluded_fields` (Vertex's
`instanceConfig.excludedFields`). For a Vertex job, CSV files (`.gz` too) are first
converted here to JSON objects in `OUTPUT_PREFIX/instances-<time>/*.jsonl`, `--excluded_fields`
dropped, and the job reads those (Vertex would send CSV rows as arrays, which named inputs do
not take); rows that do not fit the model are listed in `conversion.errors_stats` there.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from typing import Sequence

from deploy import api, batch_local, storage
from deploy.batch_local import FORMATS
from deploy.instances import Fields, Predictor


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
        batch_local.check_format(self.instances_format)
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


# Local twin (deploy/batch_local.py) -------------------------------------------------------

predict_local = batch_local.predict_local
BatchResult = batch_local.BatchResult


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


def _jsonl_bytes(records: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


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
        instances_dir = f"{job.output_prefix.rstrip('/')}/instances-{batch_local.timestamp()}"
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
        lines = storage.read_bytes(path).decode("utf-8-sig", errors="replace").splitlines()
        header = [h.strip() for h in next(csv.reader(lines[:1]), [])]
        batch_local.check_header(path, header, fields, excluded)
        rows = []
        for number, text in enumerate(lines[1:], start=2):
            if not text.strip():
                continue
            where, row, reason = batch_local.csv_row(path, number, text, header)
            if reason is None:
                row, reason = batch_local.checked(fields, row, excluded, typed=False)
            if reason is None:
                rows.append(row)
            else:
                errors.append(batch_local.error_record(where, row, reason))
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
    local.add_argument("--batch_size", type=int, default=4096)
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
