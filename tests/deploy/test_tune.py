"""deploy.tune: the study in tune.yaml checked, the trials' job built by deploy.submit's code,
and the HyperparameterTuningJob the client library sends (checked by the fake service against
the published schema)."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys

import pytest
import yaml

from deploy import tune
from deploy.cloud import api
from deploy.vertex import custom_job, job_spec
from deploy.vertex import study as study_lib
from deploy.vertex.job_options import JobOptions
from tests.deploy import discovery
from tests.deploy.job_configs import (
    CLOUD,
    GPU_IMAGE,
    IMAGE,
    PREBUILT_GPU,
    as_package,
    package_config,
)
from tests.support import REPO
from trainer.distribute.cluster import TASK_SPECS

JOB = "GoogleCloudAiplatformV1HyperparameterTuningJob"
PACKAGE = "gs://test-bucket/dist/trainer-0.1.0.tar.gz"


def _study() -> dict:
    with open(study_lib.STUDY) as f:
        return yaml.safe_load(f)


def _trial_spec(study: dict, extra_args=(), package: bool = False) -> dict:
    """The trials' spec of config.yaml (containerSpec pools), or of config.yaml's pools turned
    into pythonPackageSpec pools."""
    config = as_package(job_spec.load_config()) if package else job_spec.load_config()
    spec = custom_job.resolve(
        config,
        package_uri=PACKAGE if package else None,
        output_dir="gs://test-bucket/tune/1",
        extra_args=extra_args,
        cloud=CLOUD,
    )
    return tune.trial_spec(spec, study)


def _args(pool: dict) -> list[str]:
    return job_spec.task_spec(pool)["args"]


def test_tune_yaml_is_a_valid_study_of_the_trainers_metric():
    study = study_lib.load_study()
    assert study["studySpec"]["metrics"] == [{"metricId": "accuracy", "goal": "MAXIMIZE"}]
    params = {p["parameterId"]: p for p in study["studySpec"]["parameters"]}
    assert set(params) == {"learning_rate", "layer_size", "max_iteration_steps", "dropout"}
    assert params["learning_rate"]["scaleType"] == "UNIT_LOG_SCALE"
    assert params["layer_size"]["integerValueSpec"] == {"minValue": "16", "maxValue": "256"}
    job = tune.TuningJob("t", study, _trial_spec(study))
    assert discovery.validate(job.body(), JOB) == []
    assert (job.body()["maxTrialCount"], job.body()["parallelTrialCount"]) == (20, 4)


def _change(path: str, value):
    """A change of tune.yaml: `value` at a dotted path (numbers index lists); None deletes."""

    def change(study):
        *parents, last = path.split(".")
        node = study
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        index: int | str = int(last) if last.isdigit() else last
        if value is None:
            del node[index]
        else:
            node[index] = value

    return change


P = "studySpec.parameters"


@pytest.mark.parametrize(
    "change, message",
    [
        # the metric
        (_change("studySpec.metrics", None), "studySpec.metrics is missing"),
        (_change("studySpec.metrics.0.metricId", "f1"), "metricId ('f1') is not a metric"),
        (_change("studySpec.metrics.0.goal", "MINIMIZE"), "accuracy must be MAXIMIZED"),
        (
            _change("studySpec.metrics", [{"metricId": "accuracy"}, {"metricId": "loss"}]),
            "has 2 metrics; the trainer reports one",
        ),
        # parameters
        (_change(f"{P}.0.parameterId", "learning_rat"), "('learning_rat') is not a trainer flag"),
        (_change(f"{P}.0.parameterId", "train_data"), "('train_data') is not a trainer flag"),
        (
            _change(f"{P}.3", {"parameterId": "dropout", "floatValueSpec": {}}),
            "parameter dropout has type 'floatValueSpec'",
        ),
        (
            _change(f"{P}.3", {"parameterId": "dropout", "type": "DOUBLE"}),
            "parameter dropout has type 'type'",
        ),
        (
            _change(f"{P}.0.doubleValueSpec", {"minValue": 0.1, "maxValue": 0.01}),
            "minValue (0.1) is above maxValue (0.01)",
        ),
        (
            _change(f"{P}.1.integerValueSpec", {"minValue": 300, "maxValue": 30}),
            "minValue (300) is above maxValue (30)",
        ),
        (
            _change(f"{P}.1", {"parameterId": "layer_size", "discreteValueSpec": {"values": [32]}}),
            "Vertex passes DISCRETE values as real numbers",
        ),
        (
            _change(f"{P}.1", {"parameterId": "layer_size", "doubleValueSpec": {}}),
            "--layer_size is an int flag; give it integerValueSpec or categoricalValueSpec",
        ),
        (
            _change(f"{P}.3.discreteValueSpec.values", [0.0, 0.5, 1.0]),
            "1.0 is outside what the trainer takes (in [0, 1))",
        ),
        (_change(f"{P}.3.discreteValueSpec.values", [0.2, 0.1]), "must increase, without repeats"),
        (
            _change(f"{P}.0.doubleValueSpec.minValue", 0.0),
            "minValue (0.0): the trainer takes values > 0",
        ),
        (
            _change(f"{P}.3.scaleType", "UNIT_LOG_SCALE"),  # dropout's values start at 0
            "UNIT_LOG_SCALE needs values above 0 (the smallest is 0)",
        ),
        (
            _change(
                f"{P}.0",
                {"parameterId": "optimizer", "categoricalValueSpec": {"values": ["adamw"]}},
            ),
            "'adamw' is not a value of the flag",
        ),
        (
            _change(
                f"{P}.3", {"parameterId": "learning_rate", "discreteValueSpec": {"values": [0.1]}}
            ),
            "parameter 'learning_rate' is listed twice",
        ),
        (_change(f"{P}.0.doubleValueSpec.defaultValue", 0.01), "do not take one"),
        (_change(f"{P}.0.scaleType", "LOG"), "scaleType ('LOG') must be one of"),
        (_change(P, []), "studySpec.parameters must list the trainer flags"),
        # the study and the job
        (_change("studySpec.algorithm", "GRID_SEARCH"), "learning_rate is a DOUBLE range"),
        (_change("studySpec.algorithm", "HYPERBAND"), "algorithm ('HYPERBAND') must be one of"),
        (
            _change("studySpec.studyStoppingConfig", {}),
            "key 'studySpec.studyStoppingConfig' is not supported",
        ),
        (_change("trialJobSpec", {}), "trialJobSpec comes from config.yaml"),
        (_change("maxTrialCount", None), "maxTrialCount (None) must be a whole number >= 1"),
        (_change("parallelTrialCount", 40), "parallelTrialCount (40) is above maxTrialCount (20)"),
        (_change("maxFailedTrialCount", -1), "maxFailedTrialCount (-1) must be a whole number"),
    ],
)
def test_bad_studies_fail_naming_the_value(change, message):
    study = _study()
    change(study)
    with pytest.raises(api.DeployError) as raised:
        study_lib.check_study(study, "tune.yaml")
    assert str(raised.value).startswith("tune.yaml: ")
    assert message in str(raised.value)


def test_other_parameter_types_the_trainer_takes():
    study = _study()
    study["studySpec"]["parameters"] += [
        {"parameterId": "optimizer", "categoricalValueSpec": {"values": ["adam", "sgd"]}},
        {"parameterId": "use_bias", "categoricalValueSpec": {"values": [True, False]}},
        {"parameterId": "batch_size", "categoricalValueSpec": {"values": ["64", "256"]}},
    ]
    study["studySpec"]["algorithm"] = "RANDOM_SEARCH"
    checked = study_lib.check_study(study, max_trial_count=8, parallel_trial_count=2)
    assert checked["studySpec"]["parameters"][-2]["categoricalValueSpec"] == {
        "values": ["true", "false"]  # as absl's boolean flags read them
    }
    assert (checked["maxTrialCount"], checked["parallelTrialCount"]) == (8, 2)
    job = tune.TuningJob("t", checked, _trial_spec(checked))
    assert discovery.validate(job.body(), JOB) == []


@pytest.mark.parametrize("package", [False, True], ids=["containerSpec", "pythonPackageSpec"])
def test_trials_report_the_study_metric_and_drop_their_own_values_of_tuned_flags(package):
    study = study_lib.load_study()
    spec = _trial_spec(
        study,
        extra_args=["--learning_rate", "0.1", "--dropout=0.5", "--seed=3", "--nouse_bias"],
        package=package,
    )
    kind = "pythonPackageSpec" if package else "containerSpec"
    assert all(set(pool) & set(TASK_SPECS) == {kind} for pool in spec["workerPoolSpecs"])
    for pool in spec["workerPoolSpecs"]:
        assert pool[kind]["args"] == [
            "--placement=replication",
            "--max_iterations=3",  # config.yaml's --max_iteration_steps=750 is tuned: dropped
            "--seed=3",
            "--nouse_bias",
            "--hypertune_metric=accuracy",
        ]
    study["studySpec"]["parameters"].append(
        {"parameterId": "use_bias", "categoricalValueSpec": {"values": ["true", "false"]}}
    )
    spec = _trial_spec(
        study_lib.check_study(study), extra_args=["--nouse_bias", "--use_bias"], package=package
    )
    assert _args(spec["workerPoolSpecs"][0])[-1] == "--hypertune_metric=accuracy"
    assert "--nouse_bias" not in _args(spec["workerPoolSpecs"][0])


def test_trial_spec_leaves_the_spec_it_was_given_as_it_was():
    spec = custom_job.resolve(
        job_spec.load_config(), package_uri=None, output_dir="gs://b/tune/1", cloud=CLOUD
    )
    before = copy.deepcopy(spec)
    tune.trial_spec(spec, study_lib.load_study())
    assert spec == before
    spec["workerPoolSpecs"][1] = {"replicaCount": 1}
    with pytest.raises(api.DeployError, match=r"workerPoolSpecs\[1\] needs exactly one of"):
        tune.trial_spec(spec, study_lib.load_study())


def test_another_hypertune_metric_in_the_args_is_refused():
    with pytest.raises(api.DeployError, match="--hypertune_metric=auc but the study optimises"):
        _trial_spec(study_lib.load_study(), extra_args=["--hypertune_metric=auc"])


def test_a_trials_args_with_the_values_vertex_appends_are_trainer_flags():
    """Each parameter at its bounds, as Vertex passes it (`--FLAG=VALUE`, DISCRETE values as
    doubles), parses with the trainer's own flags and builds its run configuration."""
    from absl import flags

    from tests.support import parsed_flags
    from trainer import task

    study = study_lib.load_study()
    args = _args(_trial_spec(study)["workerPoolSpecs"][0])
    for bound in ("minValue", "maxValue"):
        appended = []
        for p in study["studySpec"]["parameters"]:
            spec = p.get("doubleValueSpec") or p.get("integerValueSpec")
            value = spec[bound] if spec else p["discreteValueSpec"]["values"][-1]
            appended.append(f"--{p['parameterId']}={value}")
        with parsed_flags(args + appended) as parsed:
            config = task.build_config(parsed)
            assert parsed.hypertune_metric == "accuracy"
        assert config.train.learning_rate == float(
            study["studySpec"]["parameters"][0]["doubleValueSpec"][bound]
        )
    # Why DISCRETE is refused for an integer flag: the value Vertex sends does not parse.
    with pytest.raises(flags.IllegalFlagValueError), parsed_flags(["--layer_size=64.0"]):
        pass


def test_the_tunable_flags_are_the_trainers():
    """deploy.tune reads the flags' table (trainer/flags.py), which trainer.task defines."""
    from trainer import task

    kinds = {"int": "int", "float": "float", "bool": "bool", "string enum": "enum"}
    assert "learning_rate" in study_lib.TUNABLE_FLAGS and "job_dir" not in study_lib.TUNABLE_FLAGS
    for name, flag in study_lib.TUNABLE_FLAGS.items():
        trainers = task.FLAGS[name]
        assert kinds[trainers.flag_type()] == flag.kind, name
        assert trainers.default == flag.default, name
        if flag.kind == "enum":
            assert tuple(trainers.parser.enum_values) == flag.choices, name  # type: ignore[attr-defined]
        if flag.kind in ("int", "float"):
            assert flag.range is not None, f"--{name} is tunable but has no range"


def test_a_range_comes_from_the_trainers_flag():
    """--one_hot_max_size 0 is refused as the trainer refuses it (tune once said >= 0)."""
    study = copy.deepcopy(_study())
    study["studySpec"]["parameters"].append(
        {"parameterId": "one_hot_max_size", "integerValueSpec": {"minValue": 0, "maxValue": 8}}
    )
    with pytest.raises(api.DeployError, match=r"minValue \(0\): the trainer takes values >= 1"):
        study_lib.check_study(study)


@pytest.mark.parametrize("package", [False, True], ids=["config.yaml", "package config"])
def test_tune_sends_the_dry_run_body_with_submits_job_options(cloud_sdk, gcs, tmp_path, package):
    fake, cloud = cloud_sdk
    options: dict = dict(
        display_name="census-tuning",
        output_dir="gs://test-bucket/tune/1",
        options=JobOptions(
            strategy="SPOT",
            machine_types=("n1-standard-8",),
            accelerators=("chief:NVIDIA_TESLA_T4",),
            service_account="trainer@my-project.iam.gserviceaccount.com",
            tensorboard="42",
        ),
        max_trial_count=6,
        dist_dir=str(tmp_path),
    )
    if package:  # the sdist on a prebuilt image: built and uploaded
        options.update(staging_uri="gs://test-bucket/dist", config=package_config(tmp_path))
    printed = io.StringIO()
    assert tune.tune(cloud, dry_run=True, out=printed, **options) is None
    assert fake.requests == [], "a dry run sent a request"
    text = printed.getvalue()
    requests = json.loads(text[: text.index("\n]\n") + 2])
    if package:
        upload, create = requests
        assert upload["body"] == {"file": str(tmp_path / "trainer-0.1.0.tar.gz")}
    else:
        (create,) = requests  # the trainer's image: nothing to upload
    assert create["url"] == cloud.url(
        "projects/my-project/locations/us-central1/hyperparameterTuningJobs"
    )
    assert "gcloud ai hp-tuning-jobs create --project=my-project" in text
    assert "--max-trial-count=6 --parallel-trial-count=4" in text

    job = tune.tune(cloud, out=io.StringIO(), **options)
    assert job.name.startswith(
        "projects/my-project/locations/us-central1/hyperparameterTuningJobs/"
    )
    assert fake.bodies("hyperparameterTuningJobs.create") == [create["body"]]
    body = create["body"]
    assert body["maxTrialCount"] == 6 and body["maxFailedTrialCount"] == 3
    trial = body["trialJobSpec"]
    assert trial["scheduling"]["strategy"] == "SPOT"
    assert trial["tensorboard"] == "projects/my-project/locations/us-central1/tensorboards/42"
    pools = trial["workerPoolSpecs"]
    assert pools[0]["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_T4"
    if package:
        assert pools[0]["pythonPackageSpec"]["executorImageUri"] == PREBUILT_GPU
        assert all(p["pythonPackageSpec"]["packageUris"] == [PACKAGE] for p in pools)
    else:
        images = [p["containerSpec"]["imageUri"] for p in pools]
        assert images == [GPU_IMAGE, IMAGE, IMAGE, IMAGE]  # the chief's GPU: the GPU build
        assert list(gcs.bucket("test-bucket").list_blobs(prefix="dist/")) == []
    assert all(job_spec.task_spec(p)["args"][-1] == "--hypertune_metric=accuracy" for p in pools)
    got = cloud.job_client().get_hyperparameter_tuning_job(name=job.name)
    assert got.state.name == "JOB_STATE_PENDING" and got.max_trial_count == 6
    written = yaml.safe_load((tmp_path / "hp-tuning-job-census-tuning.yaml").read_text())
    assert written == {
        "studySpec": body["studySpec"],
        "maxFailedTrialCount": 3,
        "trialJobSpec": trial,
    }


def test_command_line_bad_study_fails_before_the_build(tmp_path):
    study = copy.deepcopy(_study())
    study["studySpec"]["parameters"][0]["doubleValueSpec"] = {"minValue": 1, "maxValue": 0.1}
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(study))
    dist = tmp_path / "dist"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.tune",
            "--project=my-project",
            "--staging_uri=gs://b/dist",
            "--output_dir=gs://b/tune/1",
            f"--study={path}",
            f"--dist_dir={dist}",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr == (
        f"error: {path}: parameter learning_rate.doubleValueSpec: minValue (1.0) is above "
        "maxValue (0.1).\n"
    )
    assert not dist.exists(), "an sdist was built"
    help_text = subprocess.run(
        [sys.executable, "-m", "deploy.tune", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "--max_trial_count" in help_text.stdout
