"""The one place that reads the process environment (Vertex AI's variables)."""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from trainer import cluster as cluster_lib


@dataclasses.dataclass(frozen=True)
class Environment:
    """What Vertex AI tells this replica through environment variables."""

    trial_id: str | None = None
    hp_metric_file: str | None = None
    cluster: cluster_lib.Cluster = cluster_lib.Cluster()

    @property
    def is_tuning(self) -> bool:
        """A hyperparameter tuning trial (or a metric file to report to) is present."""
        return bool(self.trial_id or self.hp_metric_file)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "Environment":
        """Raises InputError naming the bad key of a malformed TF_CONFIG or CLUSTER_SPEC."""
        return cls(trial_id=environ.get("CLOUD_ML_TRIAL_ID") or None,
                   hp_metric_file=environ.get("CLOUD_ML_HP_METRIC_FILE") or None,
                   cluster=cluster_lib.parse(environ.get("TF_CONFIG"),
                                             environ.get("CLUSTER_SPEC")))
