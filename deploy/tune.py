"""Hyperparameter tuning: a Vertex AI HyperparameterTuningJob over the study in `tune.yaml`,
whose trials run the trainer as `deploy.submit` would (config.yaml and the same job options).

    python -m deploy.tune --project=P --output_dir=gs://B/tune/census-1 \\
        --extra_args=--train_data=gs://B/data/train.csv

`tune.yaml` holds the job's study as `gcloud ai hp-tuning-jobs create --config` spells it
(camelCase; the trial job comes from config.yaml): `studySpec` (one metric, the parameters, the
algorithm), `maxTrialCount`, `parallelTrialCount`, `maxFailedTrialCount`. The metric is one the
trainer reports through cloudml-hypertune at the end of a trial (accuracy, auc, loss for a
classifier; mse, mae, loss for a regressor), and every trial gets `--hypertune_metric=METRIC`.
Each parameter is a trainer flag: Vertex appends `--FLAG=VALUE` to the trial's args, which drop
their own value of a tuned flag. A trial writes under `<output_dir>/<trial id>/`. The trials
run what config.yaml's pools run, as deploy.submit resolves them: the trainer's image
(`containerSpec`, its `PROJECT` filled with `--project`; `--image_uri` names another) or the
sdist on a prebuilt image (`pythonPackageSpec`, uploaded to `--staging_uri`). The study is
checked before any sdist is built; `--dry_run` prints the requests.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence

from deploy.cloud import api
from deploy.vertex import custom_job, job_options, job_spec
from deploy.vertex.job_options import JobOptions
from deploy.vertex.study import STUDY, TUNABLE_FLAGS, load_study


@dataclasses.dataclass(frozen=True)
class TuningJob:
    """A HyperparameterTuningJob: its name, the checked study (`studySpec` and the trial
    counts, REST JSON) and the trials' CustomJobSpec."""

    display_name: str
    study: dict
    trial_spec: dict

    @property
    def metric(self) -> str:
        return self.study["studySpec"]["metrics"][0]["metricId"]

    def body(self) -> dict:
        """The job exactly as the client library sends it.

        Raises:
            DeployError: a field the HyperparameterTuningJob message does not have, named.
        """
        return api.canonical(
            "HyperparameterTuningJob",
            {"displayName": self.display_name, **self.study, "trialJobSpec": self.trial_spec},
            "the HyperparameterTuningJob",
        )

    def request(self, cloud: api.Cloud) -> api.ApiRequest:
        return api.ApiRequest(
            "POST", cloud.url(f"{cloud.parent}/hyperparameterTuningJobs"), self.body()
        )

    def gcloud(self, cloud: api.Cloud, config_path: str) -> str:
        """The equivalent gcloud command, reading studySpec and trialJobSpec from the file."""
        return shlex.join(
            [
                "gcloud",
                "ai",
                "hp-tuning-jobs",
                "create",
                f"--project={cloud.project}",
                f"--region={cloud.region}",
                f"--display-name={self.display_name}",
                f"--max-trial-count={self.study['maxTrialCount']}",
                f"--parallel-trial-count={self.study['parallelTrialCount']}",
                f"--config={config_path}",
            ]
        )


def trial_spec(spec: dict, study: dict) -> dict:
    """The trials' CustomJobSpec: `spec` with every pool's args (its containerSpec's or its
    pythonPackageSpec's) reporting the study's metric (`--hypertune_metric`) and without their
    own values of the tuned flags.

    Raises:
        DeployError: the args name another --hypertune_metric; a pool without exactly one of
            containerSpec and pythonPackageSpec.
    """
    metric = study["studySpec"]["metrics"][0]["metricId"]
    tuned = {p["parameterId"] for p in study["studySpec"]["parameters"]}
    spec = {**spec, "workerPoolSpecs": [dict(p) for p in spec["workerPoolSpecs"]]}
    for index, pool in enumerate(spec["workerPoolSpecs"]):
        if not pool:
            continue
        key = job_spec.task_key(pool, f"workerPoolSpecs[{index}]")
        task = pool[key] = dict(pool[key])
        args = _without(task.get("args", []), tuned)
        named = [a.split("=", 1)[1] for a in args if a.startswith("--hypertune_metric=")]
        if any(m != metric for m in named):
            raise api.DeployError(
                f"the trial args say --hypertune_metric={named[0]} but the study optimises "
                f"{metric}: drop the flag (deploy.tune sets it) or change metricId."
            )
        task["args"] = [a for a in args if not a.startswith("--hypertune_metric=")] + [
            f"--hypertune_metric={metric}"
        ]
    return spec


def _without(args: Sequence[str], flags: set[str]) -> list[str]:
    """`args` without the values they give the named flags (`--f=v`, `--f v`, `--f`, `--nof`)."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            continue
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in flags:
            skip_value = "=" not in arg and TUNABLE_FLAGS[name].kind != "bool"
            continue
        if name and name.startswith("no") and name[2:] in flags:
            continue
        kept.append(arg)
    return kept


def create_job(cloud: api.Cloud, job: TuningJob):
    """Creates the HyperparameterTuningJob (the body `--dry_run` prints); does not wait."""
    import json

    from google.cloud import aiplatform_v1

    return cloud.job_client().create_hyperparameter_tuning_job(
        parent=cloud.parent,
        hyperparameter_tuning_job=aiplatform_v1.HyperparameterTuningJob.from_json(
            json.dumps(job.body())
        ),
    )


def tune(
    cloud: api.Cloud,
    *,
    staging_uri: str | None = None,
    display_name: str,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions | None = None,
    config: str = job_spec.CONFIG,
    study: str = STUDY,
    max_trial_count: int | None = None,
    parallel_trial_count: int | None = None,
    dist_dir: str | None = None,
    dry_run: bool = False,
    out=None,
):
    """Builds and uploads the trainer sdist (if a pool runs it), then creates the tuning job of
    `study`.

    Args:
        cloud: the project, region and API endpoint.
        staging_uri: gs:// folder the sdist is uploaded to (needed only if a pool runs it).
        display_name: the job's name.
        output_dir, extra_args, options, config: the trials' job, as deploy.submit takes them.
        study: the study in YAML (tune.yaml).
        max_trial_count, parallel_trial_count: override the study's counts.
        dist_dir: where the sdist is built (default: a temporary folder).
        dry_run: print the requests and the gcloud equivalent; send nothing.
        out: where the dry run prints (default: stdout).

    Returns:
        The created HyperparameterTuningJob (the client library's message, not waited for);
        None for a dry run.

    Raises:
        DeployError: a bad study, config, URI or option, before anything is built or sent.
    """
    out = out or sys.stdout
    checked = load_study(
        study, max_trial_count=max_trial_count, parallel_trial_count=parallel_trial_count
    )
    dist_dir = dist_dir or tempfile.mkdtemp(prefix="trainer-sdist-")
    staged = custom_job.stage(
        cloud,
        lambda spec: TuningJob(display_name, checked, trial_spec(spec, checked)),
        staging_uri=staging_uri,
        config=config,
        output_dir=output_dir,
        extra_args=extra_args,
        options=options or JobOptions(),
        dist_dir=dist_dir,
    )
    job = staged.job
    spec_path = os.path.join(dist_dir, f"hp-tuning-job-{api.file_stem(display_name)}.yaml")
    body = job.body()
    custom_job.write_yaml(  # the trial counts go on gcloud's command line
        spec_path,
        {
            k: v
            for k, v in body.items()
            if k not in ("displayName", "maxTrialCount", "parallelTrialCount")
        },
    )
    custom_job.send_or_show(staged, cloud, dry_run=dry_run, out=out)
    print(
        f"# equivalent gcloud command (study and trial job in {spec_path}):\n"
        f"{job.gcloud(cloud, spec_path)}",
        file=out,
    )
    return None if dry_run else create_job(cloud, job)


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    api.add_cloud_flags(p)
    job_options.add_job_flags(p, display_name="adanet-census-tuning")
    p.add_argument("--study", default=STUDY, help="The study in YAML (tune.yaml).")
    p.add_argument("--max_trial_count", type=int, help="Trials in all (default: the study's).")
    p.add_argument(
        "--parallel_trial_count", type=int, help="Trials at a time (default: the study's)."
    )
    args = p.parse_args(argv)
    job = tune(
        **job_options.job_arguments(args),
        study=args.study,
        max_trial_count=args.max_trial_count,
        parallel_trial_count=args.parallel_trial_count,
    )
    if job is not None:
        print(job.name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
