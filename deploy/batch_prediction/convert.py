"""Sources for a Vertex AI batch job, converted to what the model's server takes before the
job is created. Vertex would send CSV rows to the model as arrays, which its named inputs do
not take, and JSON Lines instances as they are, which TensorFlow Serving (Vertex's prebuilt
container) refuses where a field is null or left out. So each source file's instances are
checked against the model's inputs (as the local twin and `deploy.serve` check them), the
fields not sent dropped (`deploy/batch_prediction/instance_config.py`; a `--key_field` is kept, and
the job's `instanceConfig.keyField` takes it out again), and written to
`OUTPUT_PREFIX/instances-<time>/*.jsonl` with every field present and a missing value as
TensorFlow Serving takes it (`NaN` for a number: it refuses null; "" for a text); the job
reads those. Instances that do not fit the model are listed in `conversion.errors_stats`
there."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

from deploy.batch_prediction import output, reading
from deploy.batch_prediction.instance_config import InstanceConfig
from deploy.batch_prediction.vertex import VertexBatchJob, submit_vertex
from deploy.cloud import api, storage
from deploy.serving.instances import Fields, Predictor

_SUFFIXES = (".gz", ".csv", ".jsonl", ".json")


@dataclasses.dataclass(frozen=True)
class ConvertedVertexJob:
    """A Vertex job over CSV or JSON Lines sources, run over JSON Lines converted from them.

    Before the job is created, each source file (may be `.gz`; a CSV's header row first)
    becomes `instances_dir/NNNNN-NAME.jsonl`: one object per instance, typed by the model's
    inputs as the local twin types them, without `excluded_fields`, every field present and a
    missing value written as TensorFlow Serving takes it. An instance that does not fit is
    never sent: it goes to `instances_dir/conversion.errors_stats` (records like Vertex's
    errors_stats, with file and line) and is counted. The job then reads
    `instances_dir/*.jsonl`.

    Example:
        converted = ConvertedVertexJob.of(VertexBatchJob(
            display_name="census", model="123", sources=("gs://b/in/*.csv",),
            output_prefix="gs://b/out", instances_format="csv"),
            excluded_fields=["income_bracket"])
        conversion, created = submit_vertex_converted(cloud, converted)
    """

    job: VertexBatchJob
    instances_dir: str
    config: InstanceConfig = InstanceConfig()
    # The SavedModel whose inputs type the rows; default: the registered model's artifactUri.
    model_dir: str | None = None

    def __post_init__(self):
        api.gcs_uri("instances_dir", self.instances_dir)

    @classmethod
    def of(
        cls,
        job: VertexBatchJob,
        *,
        excluded_fields: Sequence[str] = (),
        key_field: str | None = None,
        included_fields: Sequence[str] = (),
        model_dir: str | None = None,
    ) -> ConvertedVertexJob:
        """`job` with its sources converted under OUTPUT_PREFIX/instances-<time>/."""
        instances_dir = f"{job.output_prefix.rstrip('/')}/instances-{output.timestamp()}"
        config = InstanceConfig.of(key_field, included_fields, excluded_fields)
        return cls(job, instances_dir, config, model_dir)

    @property
    def jsonl_job(self) -> VertexBatchJob:
        """The job Vertex runs: over the converted files."""
        return dataclasses.replace(
            self.job,
            sources=(f"{self.instances_dir}/*.jsonl",),
            instances_format="jsonl",
            key_field=self.config.key_field,
            included_fields=(),
            excluded_fields=(),
        )

    @property
    def error_file(self) -> str:
        return f"{self.instances_dir}/conversion.errors_stats"

    def jsonl_file(self, index: int, source: str) -> str:
        """The converted file of the `index`-th source file."""
        name = source.rsplit("/", 1)[-1]
        while name.endswith(_SUFFIXES):
            name = name[: name.rindex(".")]
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
        kind = {"csv": "CSV file", "bigquery": "BigQuery table"}.get(
            self.job.instances_format, "JSON Lines file"
        )
        return (
            f"would convert each {kind} of {', '.join(self.job.sources)} to "
            f"{self.instances_dir}/NNNNN-NAME.jsonl (its index and name), one JSON object "
            "per instance with every field of the model (a missing number as NaN), and list "
            f"the instances that do not fit the model in {self.error_file}"
        )


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What `convert` wrote."""

    instances_dir: str
    files: tuple[str, ...]
    error_file: str
    num_rows: int
    num_errors: int

    def summary(self) -> str:
        return (
            f"converted for the model: {self.num_rows} instances, {self.num_errors} with "
            f"errors (listed in {self.error_file}); {len(self.files)} .jsonl file(s) in "
            f"{self.instances_dir}/"
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


def convert(converted: ConvertedVertexJob, fields: Fields) -> Conversion:
    """Writes the job's instances as JSON Lines objects for the model (see ConvertedVertexJob).

    Cost: reads every source and holds its converted instances in memory, so that a CSV file
    whose header does not fit the model, or sources where no instance fits, stop everything
    (DeployError) before a file is written. A file with no instance that fits gets no .jsonl
    file.
    """
    config = converted.config
    files, errors = {}, []
    for index, (path, instances) in enumerate(_sources(converted, fields)):
        rows = []
        for where, instance, key, reason in instances:
            if reason is None:  # the key goes with it: the job's keyField takes it out
                keyed = {config.key_field: key} if config.key_field else {}
                rows.append({**fields.for_tf_serving(instance), **keyed})
            else:
                errors.append(output.error_record(where, instance, reason))
        if rows:
            files[converted.jsonl_file(index, path)] = rows
    num_rows = sum(map(len, files.values()))
    if not num_rows:
        first = errors[0]["error"]["message"] if errors else "the files hold no instance"
        raise api.DeployError(
            f"no instance of {', '.join(converted.job.sources)} fits the model ({first})."
        )
    for path, rows in files.items():
        storage.write_bytes(path, _jsonl_bytes(rows))
    storage.write_bytes(converted.error_file, _jsonl_bytes(errors))
    return Conversion(
        converted.instances_dir, tuple(files), converted.error_file, num_rows, len(errors)
    )


Instances = Iterator[tuple[str, Any, Any, "str | None"]]


def _sources(converted: ConvertedVertexJob, fields: Fields) -> Iterator[tuple[str, Instances]]:
    """(a source, its instances) for each source file, or for the job's one table."""
    job, config = converted.job, converted.config
    if job.instances_format == "bigquery":
        yield job.sources[0], reading.table_instances(job.sources[0], fields, config)
        return
    read = _csv_instances if job.instances_format == "csv" else _jsonl_instances
    for path in storage.expand(list(job.sources)):
        text = storage.read_bytes(path).decode("utf-8-sig", errors="replace")
        yield path, read(path, text.split("\n"), fields, config)


def _csv_instances(
    path: str, lines: list[str], fields: Fields, config: InstanceConfig
) -> Instances:
    """(where, the row, its key, why it does not fit or None) for each row of a CSV file; a
    header that does not fit the model stops everything (DeployError)."""
    header = [h.strip() for h in next(csv.reader(lines[:1]), [])]
    reading.check_header(path, header, fields, config)
    for number, text in enumerate(lines[1:], start=2):
        if text.strip():
            yield reading.read_instance(path, number, text, fields, config, header)


def _jsonl_instances(
    path: str, lines: list[str], fields: Fields, config: InstanceConfig
) -> Instances:
    """(where, the instance, its key, why it does not fit or None) for each line of a JSON
    Lines file, checked as the local twin and the server check them."""
    for number, text in enumerate(lines, start=1):
        if text.strip():
            yield reading.read_instance(path, number, text, fields, config)


def submit_vertex_converted(cloud: api.Cloud, converted: ConvertedVertexJob):
    """Converts the job's instances (see ConvertedVertexJob), then creates the job over the
    converted files and returns at once: (the Conversion, the SDK's job object). Bad input
    raises DeployError before anything is written or created."""
    fields = model_fields(cloud, converted.job.model, converted.model_dir)
    conversion = convert(converted, fields)
    return conversion, submit_vertex(cloud, converted.jsonl_job)


def _jsonl_bytes(records: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()
