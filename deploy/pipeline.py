"""A Vertex AI Pipelines run (Kubeflow Pipelines v2): train -> evaluate -> register -> batch
predict, each step the request another deploy command sends.

    python -m deploy.pipeline --project=P \\
        --output_dir=gs://B/runs/census-1 --pipeline_root=gs://B/pipeline-root \\
        --extra_args=--train_data=gs://B/data/train.csv --require='accuracy>=0.8' \\
        --batch_source='gs://B/in/*.jsonl' --batch_output_prefix=gs://B/predictions

- **train**: the CustomJob of config.yaml and the job flags, exactly as `deploy.submit` builds
  it (config.yaml's pools run the trainer's image; a pool that runs the sdist has it uploaded
  to `--staging_uri` first); the step waits for the job.
- **evaluate**: reads the job's `report.json` (its job dir: `--job_dir`, else `--checkpoint_dir`,
  else `<output_dir>/checkpoints/`, as the trainer chooses it on Vertex AI), logs the exported
  model's eval metrics as the step's Metrics artifact, and fails the run, registering nothing,
  if one of `--require` (`METRIC>=VALUE`, `METRIC<=VALUE`, repeatable) does not hold.
- **register**: uploads the model the report names to the Model Registry with the body
  `deploy.publish` sends, as a new version of `--parent_model` if given.
- **batch predict** (with `--batch_source`): the BatchPredictionJob `deploy.batch vertex`
  builds, over JSON Lines, on the registered version; the step waits for it.

The steps are lightweight Python components (`COMPONENT_IMAGE`, installing the Vertex AI SDK at
start), not google-cloud-pipeline-components' operators: every release of those pins
google-cloud-aiplatform below 2, which this package is past. Caching is off: each step creates
something. Everything is checked before any sdist is built. The compiled pipeline spec is
written to `--dist_dir` (`pipeline-<display_name>.yaml`, a template the Vertex AI console can
run too); `--dry_run` prints the sdist upload (if any) and the PipelineJob request holding that
spec.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence

from deploy.cloud import api
from deploy.vertex import custom_job, job_options, job_spec, publishing
from deploy.vertex.pipelines import (
    PipelineOptions,
    Requirement,
    TrainingPipeline,
    check_jsonl,
    create_job,
    pipeline_name,
)


def run(
    cloud: api.Cloud,
    *,
    staging_uri: str | None = None,
    display_name: str,
    pipeline: PipelineOptions,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: job_options.JobOptions | None = None,
    config: str = job_spec.CONFIG,
    dist_dir: str | None = None,
    dry_run: bool = False,
    out=None,
):
    """Builds and uploads the trainer sdist (if a pool runs it), compiles the pipeline and
    submits a PipelineJob.

    Args:
        cloud: the project, region and API endpoint.
        staging_uri, display_name, output_dir, extra_args, options, config, dist_dir: the
            training job's, as `deploy.vertex.custom_job.submit` takes them.
        pipeline: the pipeline root and the steps after training.
        dry_run: print the requests; send nothing (any sdist is built, the spec written).
        out: where the dry run prints (default: stdout).

    Returns:
        The created PipelineJob (the client library's message, not waited for); None for a
        dry run.

    Raises:
        DeployError: bad input, before anything is built or sent.
    """
    out = out or sys.stdout
    options = options or job_options.JobOptions()
    dist_dir = dist_dir or tempfile.mkdtemp(prefix="trainer-sdist-")
    staged = custom_job.stage(
        cloud,
        lambda spec: TrainingPipeline.of(
            cloud, custom_job.Submission(display_name, spec), pipeline
        ),
        staging_uri=staging_uri,
        config=config,
        output_dir=output_dir,
        extra_args=extra_args,
        options=options,
        dist_dir=dist_dir,
    )
    job: TrainingPipeline = staged.job
    template = os.path.join(dist_dir, f"pipeline-{pipeline_name(display_name)}.yaml")
    os.makedirs(dist_dir, exist_ok=True)  # no sdist is built when every pool is an image
    job.compile(template)
    custom_job.send_or_show(staged, cloud, dry_run=dry_run, out=out)
    print(f"# the compiled pipeline spec: {template}", file=out)
    return None if dry_run else create_job(cloud, job)


def pipeline_options(args: argparse.Namespace) -> PipelineOptions:
    """The PipelineOptions of the parsed flags (DeployError on bad ones)."""
    batch = None
    if args.batch_source or args.batch_output_prefix:
        if not (args.batch_source and args.batch_output_prefix):
            raise api.DeployError(
                "--batch_source and --batch_output_prefix go together: the batch step reads "
                "one and writes to the other (leave both out for no batch step)."
            )
        check_jsonl(args.batch_instances_format)  # before TensorFlow loads
        from deploy.batch_prediction import vertex as batch_vertex

        batch = batch_vertex.VertexBatchJob(
            display_name=f"{args.display_name}-batch",
            model=publishing.PENDING_MODEL,
            sources=tuple(s for s in args.batch_source.split(",") if s),
            output_prefix=args.batch_output_prefix,
            instances_format=args.batch_instances_format,
            machine_type=args.batch_machine_type,
            starting_replica_count=args.batch_starting_replica_count,
            max_replica_count=args.batch_max_replica_count,
        )
    return PipelineOptions(
        pipeline_root=args.pipeline_root,
        model_display_name=args.model_display_name,
        parent_model=args.parent_model,
        serving_image=args.serving_image,
        requirements=tuple(Requirement.parse(r) for r in args.require),
        batch=batch,
        service_account=args.pipeline_service_account,
    )


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    api.add_cloud_flags(p)
    job_options.add_job_flags(p, display_name="adanet-census")
    steps = p.add_argument_group("the pipeline")
    steps.add_argument(
        "--pipeline_root", help="gs:// folder for the steps' outputs (required by Vertex AI)."
    )
    steps.add_argument(
        "--pipeline_service_account",
        help="The service account the run's steps use (default: Compute Engine's).",
    )
    steps.add_argument(
        "--require",
        action="append",
        default=[],
        help="METRIC>=VALUE or METRIC<=VALUE the model's eval metrics must meet to be "
        "registered (repeat the flag).",
    )
    steps.add_argument("--model_display_name", help="Model name (default: --display_name).")
    steps.add_argument(
        "--parent_model", help="Model id or resource name: register a new version of it."
    )
    steps.add_argument("--serving_image", default=publishing.SERVING_IMAGE)
    batch = p.add_argument_group("batch prediction (no batch step without --batch_source)")
    batch.add_argument("--batch_source", help="Comma-separated gs:// JSON Lines files or globs.")
    batch.add_argument("--batch_output_prefix", help="gs:// folder for the predictions.")
    batch.add_argument("--batch_instances_format", default="jsonl")
    batch.add_argument("--batch_machine_type", default="n2-standard-4")
    batch.add_argument("--batch_starting_replica_count", type=int, default=1)
    batch.add_argument("--batch_max_replica_count", type=int, default=1)
    args = p.parse_args(argv)
    job = run(pipeline=pipeline_options(args), **job_options.job_arguments(args))
    if job is not None:
        print(job.name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
