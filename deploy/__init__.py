"""Making the trained model useful on Vertex AI, and locally.

The top level holds the commands, one module each, `python -m deploy.<name>` with `--help` and
(where a request is sent) `--dry_run`, which prints the exact REST requests and sends nothing:

- `deploy.submit`: a CustomJob from `config.yaml` and the job options.
- `deploy.tune`: the same trial job under a HyperparameterTuningJob of the study in `tune.yaml`.
- `deploy.pipeline`: train, evaluate, register and batch predict as one Vertex AI Pipelines run.
- `deploy.publish`: Model Registry upload (a new version, the job's evaluation, a champion
  alias), endpoint, deploy; undeploy and delete.
- `deploy.predict`: online prediction from an endpoint or from the local server.
- `deploy.serve`: a local server with Vertex's custom-container contract.
- `deploy.batch`: a Vertex BatchPredictionJob, or its local twin with the same output layout.
- `deploy.monitor`: a model monitoring job on an endpoint, the training data as its baseline.
- `deploy.local_run`: `gcloud ai custom-jobs local-run`'s install and run, without Docker.
- `deploy.launch`: the job as a real multi-process cluster on this machine.

and `deploy.sdk`, the Python API for notebooks over all of them. Below the commands, the rooms
(layers, each importing only those below it: pyproject.toml's import-linter contract):

- `deploy/vertex/`: Vertex AI's resources: the CustomJob (`job_spec`, `job_options`, `checks`,
  `custom_job`, `sdist`, `estimate`), tuning studies, pipelines, publishing, the Model
  Registry (`registry`, `evaluation`, `aliases`), prebuilt images, waiting for a job.
- `deploy/batch_prediction/` and `deploy/local/`: batch prediction read, predicted and written
  as Vertex lays it out; the local cluster's processes and network.
- `deploy/serving/`: the model answering requests: signature, instances, explanations,
  micro-batching, the server.
- `deploy/cloud/`: what every command shares: the project and region, REST bodies, errors
  (`api`) and files, local or `gs://` (`storage`).
"""

import warnings

# google.api_core warns, once per client library it loads, of a Python release's end of
# support years ahead: five lines of FutureWarning before every command's output.
warnings.filterwarnings(
    "ignore", category=FutureWarning, module=r"google\.api_core\._python_version_support"
)
