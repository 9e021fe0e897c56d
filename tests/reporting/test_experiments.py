"""Vertex AI Experiments (`trainer/reporting/experiments.py`): names and defaults from flags
and Vertex AI's variables, what is logged, and real `python -m trainer.task --experiment=...` runs
against the fake Vertex AI service (its ML Metadata, `tests/deploy/fake_metadata.py`), which
the google-cloud-aiplatform SDK in the trainer reaches over REST with ordinary Application
Default Credentials (a service account key file made for the test)."""

from __future__ import annotations

import datetime
import math
import threading
import time

import pytest

from tests.deploy.fake_metadata import service_account_key
from tests.deploy.fake_vertex import FakeVertex
from tests.support import (
    FAST_FLAGS,
    load_report,
    make_data,
    minimal_record,
    run_task,
    task_env,
    wait_for,
)
from trainer.errors import InputError
from trainer.reporting import experiments

STORE = "projects/my-project/locations/us-central1/metadataStores/default"


def resolve(**changes):
    options = dict(
        experiment="census-adanet", run=None, project="my-project", region=None, api_endpoint=None
    )
    return experiments.resolve(**{**options, **changes})


# -- names and defaults ---------------------------------------------------------------------


def test_flags_name_the_run():
    target = resolve(run="lr-0-01", region="europe-west4")
    assert target == experiments.ExperimentTarget(
        "census-adanet", "lr-0-01", "my-project", "europe-west4"
    )
    assert target.run_resource == (
        "projects/my-project/locations/europe-west4/metadataStores/default/contexts/"
        "census-adanet-lr-0-01"
    )


def test_vertex_variables_name_experiment_run_project_and_region():
    # What Vertex AI sets for a CustomJob with `experiment` and `experimentRun`: full context
    # resource names (the SDK strips "<experiment>-" from the run's).
    target = resolve(
        experiment=None,
        project=None,
        environ_experiment="projects/123456/locations/asia-east1/metadataStores/default/"
        "contexts/census-adanet",
        environ_run="projects/123456/locations/asia-east1/metadataStores/default/"
        "contexts/census-adanet-trial-7",
    )
    assert target == experiments.ExperimentTarget(
        "census-adanet", "trial-7", "123456", "asia-east1"
    )
    # Plain names, and CLOUD_ML_PROJECT_ID / CLOUD_ML_REGION for the rest.
    target = resolve(
        experiment=None,
        project=None,
        environ_experiment="census-adanet",
        environ_run="run-3",
        environ_project="987",
        environ_region="us-east1",
    )
    assert (target.experiment, target.run, target.project, target.region) == (
        "census-adanet",
        "run-3",
        "987",
        "us-east1",
    )


def test_flags_win_over_vertex_variables():
    target = resolve(environ_experiment="other-exp", environ_run="other-run", environ_project="9")
    assert (target.experiment, target.project) == ("census-adanet", "my-project")
    assert target.run != "other-run"  # the variables' run belongs to their experiment


def test_default_run_names():
    assert resolve(job_id="8123").run == "job-8123"
    assert resolve(job_id="8123", trial_id="4").run == "job-8123-trial-4"
    now = datetime.datetime(2026, 11, 23, 18, 5, 9, tzinfo=datetime.timezone.utc)
    assert resolve(now=now).run == "run-20261123-180509"


def test_no_experiment_no_target():
    assert resolve(experiment=None) is None


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"experiment": "Census"}, "--experiment='Census'"),
        ({"experiment": "abc"}, "--experiment='abc'"),  # ids have at least 4 characters
        ({"experiment": "census_adanet"}, "--experiment='census_adanet'"),
        ({"experiment": "-census"}, "--experiment='-census'"),
        ({"experiment": "e" * 129}, "--experiment="),
        ({"run": "Run 1"}, "--experiment_run='Run 1'"),
        ({"run": "r" * 110}, "at most 121 characters"),
        ({"project": None}, "--experiment_project=MY_PROJECT"),
        ({"project": "My Project"}, "--experiment_project='My Project'"),
        ({"region": "moon"}, "--experiment_region='moon'"),
        ({"experiment": None, "run": "r1"}, "--experiment_run needs --experiment"),
    ],
)
def test_bad_names_are_input_errors(changes, named):
    with pytest.raises(InputError) as raised:
        resolve(**changes)
    assert named in str(raised.value)


# -- what is logged -------------------------------------------------------------------------


def test_params_as_the_command_line_writes_them():
    assert experiments.params_of(
        {
            "generator": ["dnn", "cross"],
            "learning_rate": 0.003,
            "batch_size": 256,
            "force_grow": False,
            "head": "auto",
            "eval_data": None,
        }
    ) == {
        "generator": "dnn,cross",
        "learning_rate": 0.003,
        "batch_size": 256,
        "force_grow": "false",
        "head": "auto",
    }


def test_iteration_metrics_name_the_iteration():
    record = minimal_record(1)
    assert experiments.iteration_metrics(record) == {
        "iteration_1_steps": 10,
        "iteration_1_seconds": 1.0,
        "iteration_1_objective": 0.5,
        "iteration_1_loss": 0.5,
        "eval_loss": 0.5,
        "iterations": 2,
    }


# -- the failure policy, in this process ----------------------------------------------------


class HangingVertex(FakeVertex):
    """Answers reads; every update hangs until `release` is set (a service that stopped
    answering)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def handle(self, method, path, query, body):
        if method == "PATCH":
            self.release.wait(60)
        return super().handle(method, path, query, body)


@pytest.mark.slow
def test_a_hung_service_never_holds_up_training(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account_key(tmp_path / "k")))
    fake = HangingVertex()
    with fake:
        target = experiments.ExperimentTarget(
            "h4-hang", "r1", "my-project", "us-central1", api_endpoint=fake.url
        )
        tracker = experiments.VertexExperiment(target, params={"a": 1}, flush_secs=1.0)
        tracker.on_start()
        run = f"{STORE}/contexts/h4-hang-r1"
        wait_for(lambda: run in fake.resources, timeout=120, what="the run")  # then: hung
        started = time.monotonic()
        for t in range(3):
            tracker.on_iteration(minimal_record(t))
        queued = time.monotonic() - started
        report = {"iterations": [minimal_record(0).to_json()], "final": None}
        tracker.on_end(report)
        ended = time.monotonic() - started
        params = dict(fake.resources[run]["metadata"]["_params"])
        fake.release.set()
    assert queued < 0.5  # the calls only queue: the iterations never wait on the service
    assert ended < 3.0  # at the end, at most flush_secs more
    assert params == {}  # the first update (the params) never got through


# -- real trainer runs against the fake service ---------------------------------------------


@pytest.fixture
def vertex(tmp_path):
    """The fake service and a trainer environment with credentials (no network, no gcloud)."""
    with FakeVertex() as fake:
        env = task_env(
            GOOGLE_APPLICATION_CREDENTIALS=str(service_account_key(tmp_path / "key.json"))
        )
        for name in ("GOOGLE_CLOUD_PROJECT", "CLOUD_ML_PROJECT_ID", "CLOUD_ML_REGION"):
            env.pop(name, None)
        yield fake, env


TRAIN_FLAGS = [*FAST_FLAGS, "--max_iteration_steps=100", "--label_column=target"]


def _context(fake: FakeVertex, context_id: str) -> dict:
    return fake.resources[f"{STORE}/contexts/{context_id}"]


@pytest.mark.slow
def test_a_run_logs_flags_iterations_and_final_metrics(tmp_path, vertex):
    fake, env = vertex
    data = make_data(tmp_path, "binary", n_train=1000, n_eval=300)
    job_dir = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={data.train}",
            f"--eval_data={data.eval}",
            f"--job_dir={job_dir}",
            *TRAIN_FLAGS,
            "--experiment=h4-census",
            "--experiment_run=first-try",
            "--experiment_project=my-project",
            f"--experiment_api_endpoint={fake.url}",
        ],
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Vertex AI Experiments: could not" not in result.stderr
    assert fake.problems == []
    report = load_report(job_dir)

    experiment = _context(fake, "h4-census")
    run = _context(fake, "h4-census-first-try")
    assert experiment["schemaTitle"] == "system.Experiment"
    assert run["schemaTitle"] == "system.ExperimentRun"
    assert fake.context_children(experiment["name"]) == [run["name"]]
    assert run["metadata"]["_state"] == "COMPLETE"

    params = run["metadata"]["_params"]
    assert params["train_data"] == str(data.train)
    assert params["label_column"] == "target"
    assert params["max_iteration_steps"] == 100
    assert params["batch_size"] == 32
    assert params["learning_rate"] == 0.01
    assert params["generator"] == "trees,kheads"
    assert params["force_grow"] == "false"
    assert not [p for p in params if p.startswith("experiment")]

    metrics = run["metadata"]["_metrics"]
    assert len(report["iterations"]) == 2
    for it in report["iterations"]:
        t = it["iteration"]
        chosen = next(c for c in it["candidates"] if c["name"] == it["chosen"])
        for name in ("loss", "accuracy", "auc"):
            assert math.isclose(metrics[f"iteration_{t}_{name}"], chosen["eval"][name])
        assert math.isclose(metrics[f"iteration_{t}_objective"], chosen["objective"])
        assert metrics[f"iteration_{t}_steps"] == it["steps"] == 100
    assert metrics["iterations"] == 2
    assert math.isclose(metrics["eval_accuracy"], metrics["iteration_1_accuracy"])
    final = report["final"]["metrics"]
    for name in ("loss", "accuracy", "auc"):
        assert math.isclose(metrics[f"final_{name}"], final[name])
    assert final["accuracy"] > 0.8  # the synthetic signal was learned
    assert metrics["final_examples"] == report["final"]["examples"] == 300
    members = [m["key"] for m in report["architecture"]["members"]]
    assert metrics["ensemble_size"] == len(members)
    assert metrics["ensemble"] == f"{report['architecture']['ensembler']}: {', '.join(members)}"
    assert math.isclose(
        metrics["training_seconds"],
        sum(it["seconds"]["total"] for it in report["iterations"]),
        abs_tol=0.01,
    )


class FailingVertex(FakeVertex):
    """The service goes away (503 to everything) once the first iteration's metrics are in."""

    def __init__(self):
        super().__init__()
        self.down = False

    def handle(self, method, path, query, body):
        if self.down:
            self._fail(503, "UNAVAILABLE", "the service is unavailable")
        answer = super().handle(method, path, query, body)
        metrics = (body or {}).get("metadata", {}).get("_metrics", {})
        if method == "PATCH" and "iteration_0_steps" in metrics:
            self.down = True
        return answer


@pytest.mark.slow
def test_vertex_variables_resume_the_run_and_a_lost_service_loses_no_training(tmp_path):
    """As on Vertex AI: the CustomJob's experiment run exists before the trainer starts (the
    SDK creates it when the job is submitted) and AIP_EXPERIMENT_* name it. The service then
    fails after iteration 0: a warning, and training ends normally."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    data = make_data(tmp_path, "regression", n_train=1000, n_eval=300)
    job_dir = tmp_path / "job"
    with FailingVertex() as fake:
        aiplatform.init(
            project="my-project",
            location="us-central1",
            api_endpoint=fake.url,
            api_transport="rest",
            credentials=AnonymousCredentials(),
        )
        experiment = aiplatform.Experiment.get_or_create("h4-env")
        aiplatform.ExperimentRun.create("job-77", experiment=experiment)
        env = task_env(
            GOOGLE_APPLICATION_CREDENTIALS=str(service_account_key(tmp_path / "key.json")),
            AIP_EXPERIMENT_NAME=f"{STORE}/contexts/h4-env",
            AIP_EXPERIMENT_RUN_NAME=f"{STORE}/contexts/h4-env-job-77",
            CLOUD_ML_PROJECT_ID="my-project",
            CLOUD_ML_REGION="us-central1",
        )
        result = run_task(
            [
                f"--train_data={data.train}",
                f"--eval_data={data.eval}",
                f"--job_dir={job_dir}",
                *TRAIN_FLAGS,
                f"--experiment_api_endpoint={fake.url}",
            ],
            env=env,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_report(job_dir)["status"] == "complete"
    warnings = [
        line for line in result.stderr.splitlines() if "Vertex AI Experiments: could not" in line
    ]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert "iteration 1's metrics" in warnings[0] and "h4-env-job-77" in warnings[0]
    assert "training goes on" in warnings[0]

    run = _context(fake, "h4-env-job-77")
    assert len(fake.metadata_resources("contexts", "system.ExperimentRun")) == 1  # resumed
    assert run["metadata"]["_state"] == "RUNNING"  # never ended: the service was gone
    assert run["metadata"]["_params"]["label_column"] == "target"
    metrics = run["metadata"]["_metrics"]
    assert metrics["iteration_0_steps"] == 100
    assert "iteration_0_mse" in metrics
    assert not [m for m in metrics if m.startswith(("iteration_1", "final_"))]


@pytest.mark.slow
def test_a_bad_experiment_name_stops_before_any_work(tmp_path, vertex):
    fake, env = vertex
    data = make_data(tmp_path, "binary", n_train=200, n_eval=50)
    job_dir = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={data.train}",
            f"--job_dir={job_dir}",
            *TRAIN_FLAGS,
            "--experiment=Census_Runs",
            "--experiment_project=my-project",
            f"--experiment_api_endpoint={fake.url}",
        ],
        env=env,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "--experiment='Census_Runs'" in lines[0]
    assert not job_dir.exists()
    assert fake.requests == []
