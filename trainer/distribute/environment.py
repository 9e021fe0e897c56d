"""The one place that reads the process environment (Vertex AI's variables)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from trainer.distribute import cluster as cluster_lib


@dataclasses.dataclass(frozen=True)
class Environment:
    """What Vertex AI tells this replica through environment variables."""

    trial_id: str | None = None
    hp_metric_file: str | None = None
    cluster: cluster_lib.Cluster = cluster_lib.Cluster()
    # Output dirs a job with `baseOutputDirectory` gets (gs:// URIs; `<base>/<trial>/...` under
    # tuning): the default model, checkpoint and TensorBoard dirs when no flag names them.
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    log_dir: str | None = None
    # Vertex AI Experiments (trainer/reporting/experiments.py): the project (number) and region
    # the job runs in, its id, and the experiment and run a CustomJob names (names or resource
    # names).
    project: str | None = None
    region: str | None = None
    job_id: str | None = None
    experiment: str | None = None
    experiment_run: str | None = None
    # A Vertex AI managed dataset (a training pipeline run on one): its format (`bigquery`,
    # `csv`, `jsonl`) and its splits' URIs (bq://PROJECT.DATASET.TABLE, or gs:// wildcards).
    data_format: str | None = None
    training_data_uri: str | None = None
    validation_data_uri: str | None = None
    test_data_uri: str | None = None
    # `HOST:PORT` of a BigQuery Storage Read API emulator (plain gRPC, no credentials): tests
    # and local runs; on Vertex AI unset, and tables are read from Google's endpoint.
    bigquery_emulator_host: str | None = None

    @property
    def is_tuning(self) -> bool:
        """A hyperparameter tuning trial (or a metric file to report to) is present."""
        return bool(self.trial_id or self.hp_metric_file)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Environment:
        """Raises InputError naming the bad key of a malformed TF_CONFIG or CLUSTER_SPEC."""
        return cls(
            trial_id=environ.get("CLOUD_ML_TRIAL_ID") or None,
            hp_metric_file=environ.get("CLOUD_ML_HP_METRIC_FILE") or None,
            model_dir=environ.get("AIP_MODEL_DIR") or None,
            checkpoint_dir=environ.get("AIP_CHECKPOINT_DIR") or None,
            log_dir=environ.get("AIP_TENSORBOARD_LOG_DIR") or None,
            project=environ.get("CLOUD_ML_PROJECT_ID") or None,
            region=environ.get("CLOUD_ML_REGION") or None,
            job_id=environ.get("CLOUD_ML_JOB_ID") or None,
            experiment=environ.get("AIP_EXPERIMENT_NAME") or None,
            experiment_run=environ.get("AIP_EXPERIMENT_RUN_NAME") or None,
            data_format=environ.get("AIP_DATA_FORMAT") or None,
            training_data_uri=environ.get("AIP_TRAINING_DATA_URI") or None,
            validation_data_uri=environ.get("AIP_VALIDATION_DATA_URI") or None,
            test_data_uri=environ.get("AIP_TEST_DATA_URI") or None,
            bigquery_emulator_host=environ.get("BIGQUERY_STORAGE_EMULATOR_HOST") or None,
            cluster=cluster_lib.parse(environ.get("TF_CONFIG"), environ.get("CLUSTER_SPEC")),
        )
