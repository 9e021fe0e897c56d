"""deploy.sdk, the notebook API, against the fake Vertex AI service (and its Cloud Logging
`entries:list`, validated by Logging's discovery document) and a small census model; the
notebook that uses it is run by tests/deploy/test_notebook.py."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest

from deploy import sdk
from deploy.vertex import waiting
from tests.deploy.test_predict import _deployed
from trainer.input.files import CENSUS_LABEL, CENSUS_TEST


def _entry(second: int, text: str, insert_id: str, task: str = "workerpool0-0") -> dict:
    return {
        "timestamp": f"2026-11-28T10:00:{second:02d}Z",
        "insertId": insert_id,
        "textPayload": text,
        "labels": {"ml.googleapis.com/task_name": task},
    }


def _submitted(cloud, fake, **flags) -> sdk.TrainingJob:
    return sdk.submit(
        cloud,
        display_name="census",
        output_dir="gs://test-bucket/runs/1",
        flags=flags,
        logging_endpoint=fake.url,
    )


def test_a_submitted_job_is_waited_on_with_its_logs_streamed_once_each(cloud_sdk):
    fake, cloud = cloud_sdk
    job = _submitted(cloud, fake, max_iterations=1)
    assert fake.bodies("customJobs.create")[0]["displayName"] == "census"
    args = fake.bodies("customJobs.create")[0]["jobSpec"]["workerPoolSpecs"][0]
    assert "--max_iterations=1" in args["containerSpec"]["args"]
    assert (job.job_dir, job.model_dir) == (
        "gs://test-bucket/runs/1/checkpoints",
        "gs://test-bucket/runs/1/model",
    )
    job_id = job.name.rsplit("/", 1)[1]
    fake.log_entries[job_id] = [_entry(1, "starting", "a"), _entry(2, "iteration 0", "b")]
    out = io.StringIO()
    logs = job.job.logs
    assert logs is not None
    assert logs.show_new(out) == 2
    # more entries come, one with the newest timestamp already shown: each is shown once
    fake.log_entries[job_id] += [_entry(2, "iteration 0 step 100", "c", "workerpool1-0")]
    fake.log_entries[job_id] += [_entry(3, "exported", "d")]
    fake.set_state(job.name, "JOB_STATE_SUCCEEDED")
    job.wait(poll_seconds=0.01, out=out)
    assert out.getvalue().splitlines() == [
        "[workerpool0-0] starting",
        "[workerpool0-0] iteration 0",
        "[workerpool1-0] iteration 0 step 100",
        "[workerpool0-0] exported",
        f"{job.name}: JOB_STATE_SUCCEEDED",
    ]
    assert fake.problems == []


def test_logs_come_page_by_page(cloud_sdk):
    fake, cloud = cloud_sdk
    job = _submitted(cloud, fake)
    job_id = job.name.rsplit("/", 1)[1]
    fake.log_entries[job_id] = [_entry(i % 60, f"line {i}", str(i)) for i in range(2500)]
    fake.log_entries[job_id].sort(key=lambda e: e["timestamp"])
    logs = job.job.logs
    assert logs is not None
    assert logs.show_new(io.StringIO()) == 2500
    pages = fake.bodies("entries.list")
    assert [b.get("pageToken") for b in pages] == [None, "1000", "2000"]
    assert len({b["filter"] for b in pages}) == 1, "a page token goes with its own filter"


def test_a_failed_job_raises_with_vertex_s_message(cloud_sdk):
    fake, cloud = cloud_sdk
    job = _submitted(cloud, fake)
    fake.set_state(job.name, "JOB_STATE_FAILED", error="The replica workerpool0-0 exited 1")
    out = io.StringIO()
    with pytest.raises(waiting.JobFailed, match="JOB_STATE_FAILED: The replica workerpool0-0"):
        job.wait(poll_seconds=0.01, out=out, logs=False)
    assert fake.bodies("entries.list") == [], "logs=False asks Cloud Logging nothing"


def test_waiting_past_the_timeout_says_the_job_runs_on(cloud_sdk):
    fake, cloud = cloud_sdk
    job = _submitted(cloud, fake)
    with pytest.raises(TimeoutError, match="still JOB_STATE_PENDING.*runs on regardless"):
        job.wait(poll_seconds=0.01, timeout_seconds=0.05, out=io.StringIO(), logs=False)


def test_the_job_s_report_is_read_from_its_job_dir(cloud_sdk, gcs):
    fake, cloud = cloud_sdk
    job = _submitted(cloud, fake)
    with pytest.raises(sdk.DeployError, match="does not exist: a job writes its report.json"):
        job.report()
    report = {
        "status": "complete",
        "model_dir": job.model_dir,
        "head": "binary",
        "final": {"metrics": {"accuracy": 0.85}, "constant": {"accuracy": 0.76}},
        "calibration": {"temperature": 1.2, "decision": {"threshold": 0.4}},
    }
    gcs.bucket("test-bucket").blob("runs/1/checkpoints/report.json").upload_from_string(
        json.dumps(report)
    )
    read = job.report()
    assert read.metrics == {"accuracy": 0.85} and read.constant_metrics == {"accuracy": 0.76}
    assert (read.threshold, read.temperature, read.model_dir) == (0.4, 1.2, job.model_dir)
    assert "<th>eval accuracy</th><td>0.8500</td>" in read._repr_html_()


def test_a_local_model_predicts_batch_predicts_with_keys_and_explains(census_model):
    model = sdk.LocalModel(census_model)
    test = pd.read_csv(CENSUS_TEST, skipinitialspace=True).head(300)
    test.insert(0, "id", [f"r{i}" for i in range(len(test))])
    test.loc[5, "age"] = np.nan  # a missing value: sent as null, which the model takes
    online = model.predict(test)  # the id and the label are not inputs: dropped
    classes = sdk.Report.read(f"{census_model}/../report.json").data["classes"]
    assert list(online.columns) == ["predicted", *[f"p({c})" for c in classes]]
    batch = model.batch_predict(test, key_field="id", excluded_fields=[CENSUS_LABEL])
    assert batch.attrs["errors"] == []
    assert list(batch["key"]) == list(test["id"])
    np.testing.assert_allclose(batch.iloc[:, 2:].to_numpy(), online.iloc[:, 1:].to_numpy(), 1e-5)
    assert list(batch["predicted"]) == list(online["predicted"])

    explained = model.batch_predict(
        test.head(3), key_field="id", excluded_fields=[CENSUS_LABEL], explain=True
    )
    attributions = explained.filter(like="attribution(")
    assert attributions.shape == (3, len(model.fields))
    one = model.explain(test.iloc[0])
    assert one.attributions.sum() == pytest.approx(
        one.instance_output - one.baseline_output, abs=1e-4
    )
    assert one.data["featureAttributions"] == pytest.approx(
        {c.removeprefix("attribution(").rstrip(")"): v for c, v in attributions.iloc[0].items()}
    )
    assert len(one.plot().patches) == len(model.fields)


def test_a_local_model_names_a_row_that_does_not_fit(census_model):
    model = sdk.LocalModel(census_model)
    with pytest.raises(sdk.DeployError, match="row 1: .*age"):
        model.predict([{"age": 30}, {"age": "thirty"}])
    with pytest.raises(sdk.DeployError, match="explain takes one instance; got 2"):
        model.explain([{"age": 30}, {"age": 31}])


def test_an_endpoint_predicts_a_frame(cloud_sdk, predictor, census_model, census_rows, gcs):
    fake, cloud = cloud_sdk
    fake.predictor = predictor.predict
    gcs.bucket("test-bucket").blob("model/saved_model.pb").upload_from_filename(
        f"{census_model}/saved_model.pb"
    )
    frame = pd.DataFrame(census_rows[:4])
    frame.loc[1, "age"] = np.nan
    answer = sdk.Endpoint(cloud, _deployed(cloud), classes=["<=50K", ">50K"]).predict(frame)
    local = sdk.LocalModel(census_model).predict(frame)
    pd.testing.assert_frame_equal(answer, local, rtol=1e-5)


def test_train_local_streams_the_log_and_names_a_bad_flag(tmp_path):
    out = io.StringIO()
    with pytest.raises(sdk.TrainingFailed, match="exit status 2") as failed:
        sdk.train_local(str(tmp_path / "job"), flags={"max_iterations": 0}, out=out)
    assert "--max_iterations (0) must be >= 1" in str(failed.value)
    assert "--max_iterations (0) must be >= 1" in out.getvalue()
    with pytest.raises(sdk.DeployError, match="must be a dict or a list"):
        sdk.train_local(str(tmp_path / "job"), flags="--max_iterations=1")


@pytest.mark.slow  # starts the trainer, which stops on SIGTERM as on a preemption: ~20 s
def test_a_stopped_cell_stops_the_trainer(tmp_path):
    """Interrupting train_local (a notebook's stop button) ends the trainer's process too."""
    import subprocess
    import time

    class StopAtFirstLine(io.StringIO):
        def write(self, text):
            raise KeyboardInterrupt

    job_dir = str(tmp_path / "stopped-job")
    with pytest.raises(KeyboardInterrupt):
        sdk.train_local(job_dir, flags={"max_iterations": 1}, out=StopAtFirstLine())
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", job_dir], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the trainer is still running"
        time.sleep(0.2)
