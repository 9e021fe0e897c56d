"""A Vertex AI BatchPredictionJob over JSON Lines files in a bucket, or a BigQuery table
(`python -m deploy.batch vertex`); sources are converted first
(`deploy/batch_prediction/convert.py`) unless `--send_as_is`."""

from __future__ import annotations

import dataclasses
import json

from deploy.batch_prediction import reading
from deploy.batch_prediction.instance_config import InstanceConfig
from deploy.cloud import api


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
    # instanceConfig.keyField: a field of each instance that the job does not send to the
    # model and writes as `key` in its output line instead of the instance
    key_field: str | None = None
    # generateExplanation: each output line gets the model's explanation (the model must have
    # been uploaded with an explanation spec: `deploy.publish --explain`)
    explain: bool = False
    # instanceConfig's includedFields / excludedFields, applied by Vertex (a table sent as is)
    included_fields: tuple[str, ...] = ()
    excluded_fields: tuple[str, ...] = ()

    def __post_init__(self):
        reading.check_format(self.instances_format)
        if not self.sources:
            raise api.DeployError("--source is empty: give gs:// files or globs.")
        if self.instances_format == "bigquery":
            reading.check_table(self.sources)
        else:
            for source in self.sources:
                api.gcs_uri("--source", source)
        api.gcs_uri("--output_prefix", self.output_prefix)
        api.positive("--starting_replica_count", self.starting_replica_count)
        api.positive("--max_replica_count", self.max_replica_count)
        if self.max_replica_count < self.starting_replica_count:
            raise api.DeployError(
                f"--max_replica_count ({self.max_replica_count}) is below "
                f"--starting_replica_count ({self.starting_replica_count})."
            )

    def body(self, cloud: api.Cloud) -> dict:
        return {
            "displayName": self.display_name,
            "model": cloud.resource("models", self.model),
            "inputConfig": self._input_config(),
            "outputConfig": {
                "predictionsFormat": "jsonl",
                "gcsDestination": {"outputUriPrefix": self.output_prefix},
            },
            "dedicatedResources": {
                "machineSpec": {"machineType": self.machine_type},
                "startingReplicaCount": self.starting_replica_count,
                "maxReplicaCount": self.max_replica_count,
            },
            "manualBatchTuningParameters": {},  # what the SDK sends: the service's default
            **({"instanceConfig": self.instance_config()} if self.instance_config() else {}),
            **({"generateExplanation": True} if self.explain else {}),
        }

    def _input_config(self) -> dict:
        if self.instances_format == "bigquery":
            return {"instancesFormat": "bigquery", "bigquerySource": {"inputUri": self.sources[0]}}
        return {"instancesFormat": self.instances_format, "gcsSource": {"uris": list(self.sources)}}

    def instance_config(self) -> dict:
        """The job's instanceConfig (empty: none). A table's rows go to the model as objects
        (instanceType "object"): Vertex's default for a table is arrays, which the model's
        named inputs do not take."""
        config = InstanceConfig(self.key_field, self.included_fields, self.excluded_fields).body()
        if self.instances_format == "bigquery":
            config["instanceType"] = "object"
        return config

    def request(self, cloud: api.Cloud) -> api.ApiRequest:
        return api.ApiRequest(
            "POST", cloud.url(f"{cloud.parent}/batchPredictionJobs"), self.body(cloud)
        )


def submit_vertex(cloud: api.Cloud, job: VertexBatchJob):
    """Creates the BatchPredictionJob (the body `--dry_run` prints, through the client
    library's JobService: the SDK's job class has no instanceConfig) and returns at once.

    Args:
        cloud: the project, region and API endpoint.
        job: the job over JSON Lines sources.

    Returns:
        The created job (`aiplatform_v1.BatchPredictionJob`: its `name`), not waited for.

    Raises:
        DeployError: the sources are CSV: those go through `batch_convert.submit_vertex_converted`,
            which converts their rows first.
    """
    from google.cloud import aiplatform_v1

    if job.instances_format == "csv":
        raise api.DeployError(
            "Vertex sends CSV rows to the model as arrays, which its named "
            "inputs do not take: convert them first (ConvertedVertexJob)."
        )
    return cloud.job_client().create_batch_prediction_job(
        parent=cloud.parent,
        batch_prediction_job=aiplatform_v1.BatchPredictionJob.from_json(
            json.dumps(job.body(cloud))
        ),
    )
