"""What a path names: Cloud Storage (`gs://BUCKET/NAME`), a Cloud Storage FUSE mount
(`/gcs/BUCKET/NAME`, as Vertex AI mounts buckets), or a local file. Pure string functions,
shared by the trainer and `deploy/` (no TensorFlow, no client library)."""

from __future__ import annotations

import dataclasses

GCS_PREFIX = "gs://"
FUSE_ROOT = "/gcs/"
DEFAULT_JOB_DIR = "runs/adanet"
# Files for those who serve a SavedModel, beside its graph (TensorFlow loads none of them):
# the baseline instance explanations start from (`trainer/serving/export.py` writes it,
# `deploy/serving/explain.py` reads it).
MODEL_EXTRA = "assets.extra"
EXPLANATION_BASELINE = f"{MODEL_EXTRA}/explanation_baseline.json"
# The monitoring baseline (trainer/serving/monitoring.py; deploy.monitor reads it)
MONITORING_BASELINE = f"{MODEL_EXTRA}/monitoring/baseline.json"
MONITORING_INSTANCE_SCHEMA = f"{MODEL_EXTRA}/monitoring/instance_schema.yaml"
MONITORING_ANALYSIS_SCHEMA = f"{MODEL_EXTRA}/monitoring/analysis_schema.yaml"


def is_gcs(path: str) -> bool:
    return path.startswith(GCS_PREFIX)


def is_fuse(path: str) -> bool:
    """A Cloud Storage FUSE mount as Vertex AI makes them (`/gcs/BUCKET/...`)."""
    return path.startswith(FUSE_ROOT)


def as_gcs(path: str) -> str:
    """`/gcs/BUCKET/NAME` (a Cloud Storage FUSE path, as a job on Vertex AI may name it) as
    `gs://BUCKET/NAME`, without a trailing slash; other paths as given, less that slash."""
    path = path.rstrip("/")
    return GCS_PREFIX + path[len(FUSE_ROOT) :] if is_fuse(path) else path


def vertex_dataset(train_data: str, *, jsonl: bool = False) -> dict | None:
    """Data (a `bq://` table, or files: a path, glob or comma-separated list) as a Vertex AI
    monitoring job's `trainingDataset` takes it (without its `targetField`); None where
    Vertex cannot read it (local files, Parquet). `jsonl`: files read as JSON Lines whatever
    their names."""
    data = train_data.strip()
    if data.startswith("bq://"):
        return {"bigquerySource": {"inputUri": data}}
    uris = [p.strip() for p in data.split(",") if p.strip()]
    uris = [as_gcs(u) for u in uris]
    if not all(u.startswith("gs://") for u in uris):
        return None
    name = uris[0].removesuffix(".gz")
    if jsonl or name.endswith((".jsonl", ".json")):
        fmt = "jsonl"
    elif name.endswith((".tfrecord", ".tfrecords")):
        fmt = "tf-record"
    elif name.endswith((".parquet", ".parq", ".pq")):
        return None
    else:
        fmt = "csv"
    return {"gcsSource": {"uris": uris}, "dataFormat": fmt}


def has_atomic_rename(path: str) -> bool:
    """Whether renaming a directory at `path` is one atomic step (a local POSIX filesystem)."""
    return not (is_gcs(path) or is_fuse(path) or "://" in path)


def bucket_of(path: str) -> str | None:
    """`BUCKET` of `gs://BUCKET/...` or `/gcs/BUCKET/...`; None for other paths."""
    for prefix in (GCS_PREFIX, FUSE_ROOT):
        if path.startswith(prefix):
            return path[len(prefix) :].split("/", 1)[0] or None
    return None


def split_gcs(uri: str) -> tuple[str, str]:
    """The bucket and object name of a gs:// URI.

    Args:
        uri: `gs://BUCKET/NAME`.

    Returns:
        `("BUCKET", "NAME")`; NAME may be empty.

    Raises:
        ValueError: `uri` is not a gs:// URI or names no bucket.
    """
    bucket = bucket_of(uri) if is_gcs(uri) else None
    if not is_gcs(uri) or len(uri) <= len(GCS_PREFIX):
        raise ValueError(f"'{uri}' is not a Cloud Storage URI; write gs://BUCKET/PATH.")
    if not bucket:
        raise ValueError(f"'{uri}' names no bucket; write gs://BUCKET/PATH.")
    return bucket, uri[len(GCS_PREFIX) + len(bucket) + 1 :]


def join(*parts: str) -> str:
    return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]])


@dataclasses.dataclass(frozen=True)
class OutputDirs:
    """Where a job writes: the job dir (state and report) and the three output dirs."""

    job_dir: str
    model_dir: str
    checkpoint_dir: str
    log_dir: str

    @classmethod
    def resolve(
        cls,
        *,
        job_dir: str | None = None,
        model_dir: str | None = None,
        checkpoint_dir: str | None = None,
        log_dir: str | None = None,
        aip_model_dir: str | None = None,
        aip_checkpoint_dir: str | None = None,
        aip_log_dir: str | None = None,
    ) -> OutputDirs:
        """Flags first; then, without `--job_dir`, Vertex AI's AIP_* dirs; then `job_dir`'s
        subdirs (default job dir `runs/adanet`). Without `--job_dir` the job dir is the
        checkpoint dir when one is known."""
        if job_dir:
            aip_model_dir = aip_checkpoint_dir = aip_log_dir = None  # the user said where
        checkpoints = checkpoint_dir or aip_checkpoint_dir
        root = job_dir or checkpoints or DEFAULT_JOB_DIR
        return cls(
            job_dir=root,
            model_dir=model_dir or aip_model_dir or join(root, "model"),
            checkpoint_dir=checkpoints or join(root, "checkpoints"),
            log_dir=log_dir or aip_log_dir or join(root, "logs"),
        )
