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
import math
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import NoReturn

from deploy.cloud import api
from deploy.vertex import custom_job, job_options, job_spec
from deploy.vertex.job_options import JobOptions
from trainer.flags import FLAGS, Flag

STUDY = os.path.join(job_spec.REPO, "tune.yaml")
# The metrics the trainer reports (trainer/model/heads.py: Head.metric_names) and their direction.
METRIC_GOALS = {
    "accuracy": "MAXIMIZE",
    "auc": "MAXIMIZE",
    "loss": "MINIMIZE",
    "mse": "MINIMIZE",
    "mae": "MINIMIZE",
}
ALGORITHMS = ("ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH")  # unspecified: Bayesian
SCALES = ("UNIT_LINEAR_SCALE", "UNIT_LOG_SCALE", "UNIT_REVERSE_LOG_SCALE")
_VALUE_SPECS = {
    "doubleValueSpec": "DOUBLE",
    "integerValueSpec": "INTEGER",
    "discreteValueSpec": "DISCRETE",
    "categoricalValueSpec": "CATEGORICAL",
}
# The value specs each kind of flag takes.
_SPECS_OF = {
    "float": ("doubleValueSpec", "discreteValueSpec", "categoricalValueSpec"),
    "int": ("integerValueSpec", "categoricalValueSpec"),
    "enum": ("categoricalValueSpec",),
    "bool": ("categoricalValueSpec",),
}
_STUDY_KEYS = {"metrics", "parameters", "algorithm", "measurementSelectionType", "observationNoise"}
_JOB_KEYS = {"studySpec", "maxTrialCount", "parallelTrialCount", "maxFailedTrialCount"}


Fail = Callable[[str], NoReturn]  # raises the DeployError of a study's file
# The trainer's flags that change the model or its training, with their types and ranges
# (trainer/flags.py: no TensorFlow to load).
TUNABLE_FLAGS: dict[str, Flag] = {flag.name: flag for flag in FLAGS if flag.tunable}
_BOOL_CHOICES = ("true", "false")


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


def load_study(
    path: str = STUDY,
    *,
    max_trial_count: int | None = None,
    parallel_trial_count: int | None = None,
) -> dict:
    """The study in `path` (tune.yaml), checked, with the counts given on the command line.

    Returns:
        `studySpec` (the metric's goal filled in, int64 bounds as strings),
        `maxTrialCount`, `parallelTrialCount` and `maxFailedTrialCount` as REST JSON.

    Raises:
        DeployError: the file is missing or not YAML; a key deploy.tune does not take; no
            metric, or one the trainer does not report, or the opposite goal; a parameter
            that is not a tunable trainer flag, of an unknown type, of a type the flag cannot
            take, with min > max or values outside what the trainer accepts; bad counts.
    """
    import yaml

    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise api.DeployError(f"--study={path}: no such file.") from None
    except yaml.YAMLError as e:
        raise api.DeployError(f"--study={path}: not valid YAML ({e}).") from None
    return check_study(
        raw, path, max_trial_count=max_trial_count, parallel_trial_count=parallel_trial_count
    )


def check_study(
    raw: object,
    path: str = "tune.yaml",
    *,
    max_trial_count: int | None = None,
    parallel_trial_count: int | None = None,
) -> dict:
    """`load_study`'s checks of a study already read (see there)."""

    def fail(message: str) -> NoReturn:
        raise api.DeployError(f"{path}: {message}")

    if not isinstance(raw, dict) or not isinstance(raw.get("studySpec"), dict):
        fail("needs a `studySpec` mapping (metrics, parameters, algorithm).")
    if "trialJobSpec" in raw:
        fail("trialJobSpec comes from config.yaml (--config); remove it here.")
    unknown = sorted(set(raw) - _JOB_KEYS) + sorted(
        f"studySpec.{k}" for k in set(raw["studySpec"]) - _STUDY_KEYS
    )
    if unknown:
        fail(
            f"key '{unknown[0]}' is not supported by deploy.tune (it takes "
            f"{', '.join(sorted(_JOB_KEYS))}; studySpec takes {', '.join(sorted(_STUDY_KEYS))})."
        )
    study = dict(raw["studySpec"])
    study["metrics"] = [_metric(study.get("metrics"), fail)]
    parameters = study.get("parameters")
    if not isinstance(parameters, list) or not parameters:
        fail("studySpec.parameters must list the trainer flags to tune.")
    study["parameters"] = [_parameter(p, i, fail) for i, p in enumerate(parameters)]
    ids = [p["parameterId"] for p in study["parameters"]]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        fail(f"parameter '{twice[0]}' is listed twice.")
    algorithm = study.get("algorithm", "ALGORITHM_UNSPECIFIED")
    if algorithm not in ALGORITHMS:
        fail(f"studySpec.algorithm ({algorithm!r}) must be one of {', '.join(ALGORITHMS)}.")
    doubles = [p["parameterId"] for p in study["parameters"] if "doubleValueSpec" in p]
    if algorithm == "GRID_SEARCH" and doubles:
        fail(
            f"GRID_SEARCH needs a finite grid, but {doubles[0]} is a DOUBLE range: give it "
            "discreteValueSpec values, or use RANDOM_SEARCH or the default (Bayesian)."
        )
    counts = {
        "maxTrialCount": raw.get("maxTrialCount") if max_trial_count is None else max_trial_count,
        "parallelTrialCount": (
            raw.get("parallelTrialCount") if parallel_trial_count is None else parallel_trial_count
        ),
        "maxFailedTrialCount": raw.get("maxFailedTrialCount", 0),
    }
    for key, value in counts.items():
        least = 0 if key == "maxFailedTrialCount" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            fail(f"{key} ({value!r}) must be a whole number >= {least}.")
    if counts["parallelTrialCount"] > counts["maxTrialCount"]:
        fail(
            f"parallelTrialCount ({counts['parallelTrialCount']}) is above maxTrialCount "
            f"({counts['maxTrialCount']})."
        )
    return {"studySpec": study, **counts}


def _metric(metrics: object, fail: Fail) -> dict:
    reported = ", ".join(METRIC_GOALS)
    if not isinstance(metrics, list) or not metrics:
        fail(
            "studySpec.metrics is missing: name the metric the trainer reports "
            f"({reported}), e.g. metrics: [{{metricId: accuracy, goal: MAXIMIZE}}]."
        )
    if len(metrics) > 1:
        fail(f"studySpec.metrics has {len(metrics)} metrics; the trainer reports one.")
    metric = metrics[0]
    if not isinstance(metric, dict) or set(metric) - {"metricId", "goal"}:
        fail(f"studySpec.metrics[0] ({metric!r}) must be {{metricId: ID, goal: GOAL}}.")
    metric_id = metric.get("metricId")
    if metric_id not in METRIC_GOALS:
        fail(
            f"metricId ({metric_id!r}) is not a metric the trainer reports; choose from "
            f"{reported} (the trainer's --hypertune_metric)."
        )
    goal = metric.get("goal", METRIC_GOALS[metric_id])
    if goal != METRIC_GOALS[metric_id]:
        fail(f"metric {metric_id} must be {METRIC_GOALS[metric_id]}D, not {goal!r}.")
    return {"metricId": metric_id, "goal": goal}


def _parameter(parameter: object, index: int, fail: Fail) -> dict:
    where = f"studySpec.parameters[{index}]"
    if not isinstance(parameter, dict):
        fail(f"{where} ({parameter!r}) must be a mapping.")
    name = parameter.get("parameterId")
    flag = TUNABLE_FLAGS.get(name) if isinstance(name, str) else None
    if flag is None:
        fail(
            f"{where}.parameterId ({name!r}) is not a trainer flag deploy.tune can tune; "
            f"choose from {', '.join(TUNABLE_FLAGS)}."
        )
    where = f"parameter {name}"
    kinds = [k for k in parameter if k.endswith("ValueSpec") or k == "type"]
    unknown = [k for k in kinds if k not in _VALUE_SPECS]
    if unknown or len(kinds) != 1:
        fail(
            f"{where} has {'type ' + repr(unknown[0]) if unknown else f'{len(kinds)} types'}; "
            f"give exactly one of {', '.join(_VALUE_SPECS)} "
            f"({', '.join(_VALUE_SPECS.values())})."
        )
    extra = set(parameter) - {"parameterId", "scaleType", kinds[0]}
    if extra:
        fail(f"{where}: key '{sorted(extra)[0]}' is not supported by deploy.tune.")
    kind = kinds[0]
    if kind == "discreteValueSpec" and flag.kind == "int":
        # Vertex is reported to pass a DISCRETE value as a double ("64.0"; python-aiplatform
        # issue 866 and users' code), which absl's integer flag rejects.
        fail(
            f"{where}: Vertex passes DISCRETE values as real numbers (64.0), which the "
            f"trainer's integer flag --{name} does not take; use integerValueSpec, or "
            "categoricalValueSpec with the values as strings."
        )
    if kind not in _SPECS_OF[flag.kind]:
        fail(
            f"{where}: --{name} is a{'n' if flag.kind[0] in 'aeiou' else ''} {flag.kind} flag; "
            f"give it {' or '.join(_SPECS_OF[flag.kind])}, not {kind}."
        )
    spec = parameter[kind]
    if not isinstance(spec, dict):
        fail(f"{where}.{kind} ({spec!r}) must be a mapping.")
    checked = {
        "doubleValueSpec": _double,
        "integerValueSpec": _integer,
        "discreteValueSpec": _discrete,
        "categoricalValueSpec": _categorical,
    }[kind](spec, flag, f"{where}.{kind}", fail)
    out = {"parameterId": name, kind: checked}
    scale = parameter.get("scaleType")
    if scale is not None:
        if kind == "categoricalValueSpec" or scale not in SCALES:
            fail(
                f"{where}.scaleType ({scale!r}) must be one of {', '.join(SCALES)}, "
                "and only for DOUBLE, INTEGER and DISCRETE parameters."
            )
        if scale != "UNIT_LINEAR_SCALE":
            low = float(checked.get("minValue", min(checked.get("values", [1]))))
            if low <= 0:
                fail(f"{where}: {scale} needs values above 0 (the smallest is {low:g}).")
        out["scaleType"] = scale
    return out


def _range(spec: dict, flag: Flag, where: str, fail, number: type) -> tuple:
    _no_default(spec, where, fail)
    if set(spec) != {"minValue", "maxValue"}:
        fail(f"{where} takes minValue and maxValue, not {sorted(spec)}.")
    values = []
    for key in ("minValue", "maxValue"):
        value = _number(spec.get(key), number, f"{where}.{key}", fail)
        if not flag.accepts(value):
            fail(f"{where}.{key} ({value!r}): the trainer takes values {flag.range}.")
        values.append(value)
    low, high = values
    if low > high:
        fail(f"{where}: minValue ({low!r}) is above maxValue ({high!r}).")
    return low, high


def _no_default(spec: dict, where: str, fail: Fail) -> None:
    if "defaultValue" in spec:
        fail(f"{where}.defaultValue: hyperparameter tuning jobs do not take one (Vizier does).")


def _number(value: object, number: type, where: str, fail: Fail):
    if number is int and isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)  # int64 in REST JSON
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number is int:
        ok = ok and float(value).is_integer()  # type: ignore[arg-type]
    if not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
        kind = "a whole number" if number is int else "a number"
        fail(f"{where} ({value!r}) must be {kind}.")
    return number(value)


def _double(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    low, high = _range(spec, flag, where, fail, float)
    return {"minValue": low, "maxValue": high}


def _integer(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    low, high = _range(spec, flag, where, fail, int)
    return {"minValue": api.int64(low), "maxValue": api.int64(high)}


def _discrete(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    _no_default(spec, where, fail)
    values = spec.get("values")
    if set(spec) != {"values"} or not isinstance(values, list) or not values:
        fail(f"{where} needs `values`, a list of numbers.")
    numbers = [_number(v, float, f"{where}.values", fail) for v in values]
    bad = [v for v in numbers if not flag.accepts(v)]
    if bad:
        fail(f"{where}.values: {bad[0]!r} is outside what the trainer takes ({flag.range}).")
    if numbers != sorted(set(numbers)):
        fail(f"{where}.values ({numbers}) must increase, without repeats.")
    return {"values": numbers}


def _categorical(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    _no_default(spec, where, fail)
    values = spec.get("values")
    if set(spec) != {"values"} or not isinstance(values, list) or not values:
        fail(f"{where} needs `values`, a list of strings.")
    texts = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    choices = _BOOL_CHOICES if flag.kind == "bool" else flag.choices
    for text in texts:
        if choices and text not in choices:
            fail(f"{where}: {text!r} is not a value of the flag; choose from {choices}.")
        if flag.kind in ("int", "float"):
            number = _number(
                _parse(text, flag.kind),
                int if flag.kind == "int" else float,
                f"{where}.values",
                fail,
            )
            if not flag.accepts(number):
                fail(f"{where}: {text!r} is outside what the trainer takes ({flag.range}).")
    if len(set(texts)) != len(texts):
        fail(f"{where}.values ({texts}) repeats a value.")
    return {"values": texts}


def _parse(text: str, kind: str) -> object:
    """A categorical value of a numeric flag as the flag parses it (the text if it cannot)."""
    try:
        return int(text) if kind == "int" else float(text)
    except ValueError:
        return text


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
