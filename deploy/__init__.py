"""Making the trained model useful on Vertex AI, and locally.

- `deploy.submit`: create a CustomJob from `config.yaml` (the trainer's container image,
  `deploy/container/`; or a python package, its sdist built and uploaded) and the job options
  (TensorBoard, service account, Spot, GPUs, environment); `deploy.vertex.images` warns of prebuilt
  images past or near their end of availability.
- `deploy.tune`: the same trial job under a HyperparameterTuningJob of the study in `tune.yaml`.
- `deploy.publish`: Model Registry upload, endpoint, deploy; undeploy and delete;
  `deploy.vertex.registry`: versions of a model, the job's evaluation, a champion alias.
- `deploy.pipeline`: train, evaluate, register and batch predict as one Vertex AI Pipelines run.
- `deploy.local_run`: `gcloud ai custom-jobs local-run`'s install and run, without Docker.
- `deploy.predict`: online prediction from an endpoint or from the local server.
- `deploy.serve`: a local server with Vertex's custom-container contract (aiohttp), which
  predicts requests that arrive together in one model call (`deploy.serving.batching`).
- `deploy.batch`: a Vertex BatchPredictionJob, or its local twin with the same output layout.
- `deploy.monitor`: a model monitoring job on an endpoint, the model's training data as the
  skew baseline.
- `deploy.sdk`: the Python API for notebooks (train here or on Vertex AI and wait with the
  logs streamed, `deploy.vertex.waiting`; the report as an object; predict, batch-predict and
  explain DataFrames, `deploy.batch_prediction.frames`).

Each module has a Python API and a `python -m deploy.<name>` entry point with `--help` and
`--dry_run` (prints the exact REST requests without sending them). `deploy.cloud.api` holds the
request and command-line code they share, `deploy.serving.instances` the instance format, and
`deploy.cloud.storage` file access (local paths and `gs://`).
"""

import warnings

# google.api_core warns, once per client library it loads, of a Python release's end of
# support years ahead: five lines of FutureWarning before every command's output.
warnings.filterwarnings(
    "ignore", category=FutureWarning, module=r"google\.api_core\._python_version_support"
)
