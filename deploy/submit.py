"""Submit training: create a Vertex AI CustomJob from `config.yaml` (chief, worker, ps and
evaluator pools, a base output directory) and the job options on the command line, building and
uploading the trainer's sdist first when a pool runs it.

    python -m deploy.submit --project=P --output_dir=gs://B/runs/census-1 \\
        --extra_args=--train_data=gs://B/data/train.csv
    python -m deploy.submit --project=P --output_dir=gs://B/runs/census-1 \\
        --image_uri=us-central1-docker.pkg.dev/P/adanet/trainer-cpu:0.2.0
    python -m deploy.submit --project=P --staging_uri=gs://B/dist \\
        --output_dir=gs://B/runs/census-1 --config=my-package-job.yaml

A pool runs either the trainer's own image (`containerSpec`, built from
`deploy/container/Dockerfile`, whose entry point is `python -m trainer.task`: config.yaml's
pools, `us-central1-docker.pkg.dev/PROJECT/adanet/trainer-cpu:0.1.0`) or the sdist on a prebuilt
image (`pythonPackageSpec`: its `packageUris` become the sdist uploaded to `--staging_uri`).
A literal `PROJECT` segment right after the registry host of a config's `imageUri` is the
placeholder of the project the image was pushed to: it becomes `--project` when that is a
project id, as Artifact Registry's paths name it (with a project number the command stops and
asks for the image).
`--image_uri=[POOL:]IMAGE` runs the pools (default: all) as containerSpec pools of IMAGE
instead. When no pool runs the sdist none is built or uploaded, and `--staging_uri` may be left
out. `--output_dir` sets `baseOutputDirectory`; `--extra_args` are appended to every pool's
args. Job options come from config.yaml (as `gcloud ai custom-jobs create --config` takes them)
or flags, which win: a Vertex TensorBoard (`tensorboard`, with `serviceAccount`), `network`,
`enableWebAccess`, `scheduling` (`strategy` such as SPOT or FLEX_START, `timeout`,
`maxWaitDuration`, `restartJobOnWorkerRestart`, `disableRetries`), and per pool a machine
type, GPUs and environment variables. A pool with a GPU runs the GPU twin of its image: the
prebuilt tf-gpu image of the same version for tf-cpu, the trainer's `trainer-gpu` build of the
same tag for `trainer-cpu`; any other image stays as named. All of it is checked before
anything is built or sent. The resolved spec is written to `--dist_dir`, and the equivalent
`gcloud ai custom-jobs create` command printed. A pool whose prebuilt image is past its end of
availability, or within six months of it (`deploy/vertex/images.py`), gets a warning on stderr
naming the date and what to use instead. `--dry_run` also prints, after the requests, the cost
model's estimate of the job's training speed (`trainer/placement/cost.py`) as `#` comment
lines.
"""

from __future__ import annotations

import sys

from deploy.cloud import api
from deploy.vertex.custom_job import submit
from deploy.vertex.job_options import add_job_flags, job_arguments


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    api.add_cloud_flags(p)
    add_job_flags(p, display_name="adanet-census")
    job = submit(**job_arguments(p.parse_args(argv)))
    if job is not None:
        print(job.name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
