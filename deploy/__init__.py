"""Making the trained model useful on Vertex AI, and locally.

- `deploy.submit`: build the sdist, upload it, create a CustomJob from `config.yaml` and the
  job options (TensorBoard, service account, Spot, GPUs, environment).
- `deploy.tune`: the same trial job under a HyperparameterTuningJob of the study in `tune.yaml`.
- `deploy.publish`: Model Registry upload, endpoint, deploy; undeploy and delete.
- `deploy.predict`: online prediction from an endpoint or from the local server.
- `deploy.serve`: a local server with Vertex's custom-container contract (aiohttp), which
  predicts requests that arrive together in one model call (`deploy.batching`).
- `deploy.batch`: a Vertex BatchPredictionJob, or its local twin with the same output layout.

Each module has a Python API and a `python -m deploy.<name>` entry point with `--help` and
`--dry_run` (prints the exact REST requests without sending them). `deploy.api` holds the
request and command-line code they share, `deploy.instances` the instance format, and
`deploy.storage` file access (local paths and `gs://`).
"""
