"""CSV sources for a Vertex AI batch job: Vertex would send CSV rows to the model as arrays,
which its named inputs do not take, so the rows are converted here to JSON objects (typed by
the model's inputs, `--excluded_fields` dropped) in `OUTPUT_PREFIX/instances-<time>/*.jsonl`,
and the job reads those; rows that do not fit the model are listed in `conversion.errors_stats`
there. A missing value is written as TensorFlow Serving takes it (`NaN` for a number: it
refuses null; "" for a text)."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence

from deploy import api, batch_local, storage
from deploy.batch_vertex import VertexBatchJob, submit_vertex
from deploy.instances import Fields, Predictor


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
            raise api.DeployError(
                f"CsvVertexJob needs a csv job, got instances_format {self.job.instances_format!r}."
            )
        api.gcs_uri("instances_dir", self.instances_dir)

    @classmethod
    def of(
        cls,
        job: VertexBatchJob,
        *,
        excluded_fields: Sequence[str] = (),
        model_dir: str | None = None,
    ) -> CsvVertexJob:
        """`job` with its CSV converted under OUTPUT_PREFIX/instances-<time>/."""
        instances_dir = f"{job.output_prefix.rstrip('/')}/instances-{batch_local.timestamp()}"
        return cls(job, instances_dir, tuple(excluded_fields), model_dir)

    @property
    def jsonl_job(self) -> VertexBatchJob:
        """The job Vertex runs: over the converted files."""
        return dataclasses.replace(
            self.job, sources=(f"{self.instances_dir}/*.jsonl",), instances_format="jsonl"
        )

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
        get_model = (
            []
            if self.model_dir
            else [api.ApiRequest("GET", cloud.url(cloud.resource("models", self.job.model)))]
        )
        return [*get_model, self.jsonl_job.request(cloud)]

    def plan(self) -> str:
        """The files the conversion writes, in words (what --dry_run says)."""
        return (
            f"would convert each CSV file of {', '.join(self.job.sources)} to "
            f"{self.instances_dir}/NNNNN-NAME.jsonl (its index and name), one JSON object "
            f"per row, and list the rows that do not fit the model in {self.error_file}"
        )


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What `convert_csv` wrote."""

    instances_dir: str
    files: tuple[str, ...]
    error_file: str
    num_rows: int
    num_errors: int

    def summary(self) -> str:
        return (
            f"CSV to JSON Lines: {self.num_rows} rows converted, {self.num_errors} rows "
            f"with errors (listed in {self.error_file}); {len(self.files)} .jsonl file(s) "
            f"in {self.instances_dir}/"
        )


def model_fields(cloud: api.Cloud, model: str, model_dir: str | None = None) -> Fields:
    """The input fields of the SavedModel in `model_dir` (local or gs://), or else in the
    registered model's artifactUri (one GET through the SDK)."""
    if model_dir is not None:
        return Predictor(model_dir, what=f"--model_dir ({model_dir!r})").fields
    from google.cloud import aiplatform

    cloud.init_sdk()
    artifact_uri = aiplatform.Model(cloud.resource("models", model)).uri
    if not artifact_uri:
        raise api.DeployError(
            f"model {model} has no artifactUri; pass --model_dir, the exported model."
        )
    what = f"the artifactUri of model {model} ({artifact_uri!r})"
    return Predictor(artifact_uri, what=what).fields


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
                rows.append(fields.for_tf_serving(row))
            else:
                errors.append(batch_local.error_record(where, row, reason))
        if rows:
            converted[csv_job.jsonl_file(index, path)] = rows
    num_rows = sum(map(len, converted.values()))
    if not num_rows:
        first = errors[0]["error"]["message"] if errors else "the files hold only a header"
        raise api.DeployError(
            f"no CSV row of {', '.join(csv_job.job.sources)} fits the model ({first})."
        )
    for path, rows in converted.items():
        storage.write_bytes(path, _jsonl_bytes(rows))
    storage.write_bytes(csv_job.error_file, _jsonl_bytes(errors))
    return Conversion(
        csv_job.instances_dir, tuple(converted), csv_job.error_file, num_rows, len(errors)
    )


def submit_vertex_csv(cloud: api.Cloud, csv_job: CsvVertexJob):
    """Converts the job's CSV rows (see CsvVertexJob), then creates the job over the converted
    files and returns at once: (the Conversion, the SDK's job object). Bad input raises
    DeployError before anything is written or created."""
    fields = model_fields(cloud, csv_job.job.model, csv_job.model_dir)
    conversion = convert_csv(csv_job, fields)
    return conversion, submit_vertex(cloud, csv_job.jsonl_job)


def _jsonl_bytes(records: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()
