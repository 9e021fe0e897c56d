"""deploy.predict: the same predictions from a Vertex endpoint (the fake) and locally."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from deploy import predict
from deploy.cloud import api
from deploy.vertex import publishing
from tests.support import REPO


def test_endpoint_predictions_come_through_raw_predict(cloud_sdk, predictor, census_rows):
    fake, cloud = cloud_sdk
    fake.predictor = predictor.predict
    endpoint_id = _deployed(cloud)
    answer = predict.predict_endpoint(cloud, endpoint_id, census_rows[:3])
    local = predictor.predict(census_rows[:3])
    assert [a["classes"] for a in answer] == [p["classes"] for p in local]
    np.testing.assert_allclose(
        [a["probabilities"] for a in answer], [p["probabilities"] for p in local], rtol=1e-6
    )
    sent = fake.bodies("endpoints.rawPredict")
    assert sent == [predict.predict_request(cloud, endpoint_id, census_rows[:3]).body]


def _deployed(cloud) -> str:
    """The id of an endpoint of the fake service with gs://test-bucket/model deployed."""
    published = publishing.publish(
        cloud,
        publishing.Deployment(
            model_dir="gs://test-bucket/model", display_name="m", endpoint_name="e"
        ),
    )
    return published.endpoint.rsplit("/", 1)[1]


def test_read_instances_takes_jsonl_and_json(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n\n{"x": 2}\n')
    (tmp_path / "b.json").write_text('{"instances": [{"x": 3}]}')
    assert predict.read_instances(str(tmp_path / "a.jsonl")) == [{"x": 1}, {"x": 2}]
    assert predict.read_instances(str(tmp_path / "b.json")) == [{"x": 3}]
    (tmp_path / "c.jsonl").write_text('{"x": 1}\n{"x": \n')
    with pytest.raises(api.DeployError, match="c.jsonl line 2 is not JSON"):
        predict.read_instances(str(tmp_path / "c.jsonl"))


def test_command_line_needs_one_target_and_dry_runs(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "deploy.predict", f"--instances={tmp_path / 'a.jsonl'}", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
        )

    neither = run()
    assert neither.returncode == 2 and "exactly one of --endpoint" in neither.stderr
    dry = run("--endpoint=42", "--project=my-project", "--dry_run")
    assert json.loads(dry.stdout) == [
        {
            "method": "POST",
            "body": {"instances": [{"x": 1}]},
            "url": "https://us-central1-aiplatform.googleapis.com/v1/projects/my-project/"
            "locations/us-central1/endpoints/42:rawPredict",
        }
    ]


def test_an_endpoint_gets_every_field_with_a_missing_number_as_nan(
    cloud_sdk, predictor, census_model, census_rows, gcs
):
    """TensorFlow Serving refuses null and needs every field: `deploy.predict --endpoint`
    fills them from the deployed model's signature, so a missing value is written as the
    local server takes it and both predict the same."""
    fake, cloud = cloud_sdk
    received = []

    def serving(instances):
        received.extend(instances)
        return predictor.predict(instances)

    fake.predictor = serving
    blob = gcs.bucket("test-bucket").blob("model/saved_model.pb")
    blob.upload_from_filename(f"{census_model}/saved_model.pb")  # the signature is read from it
    endpoint_id = _deployed(cloud)
    numbers = [n for n, kind in predictor.fields.kinds.items() if kind == "number"]
    texts = [n for n, kind in predictor.fields.kinds.items() if kind == "string"]
    row = census_rows[0]
    written = [
        {**row, numbers[0]: None},
        {k: v for k, v in row.items() if k not in (numbers[1], texts[0])},
        {**row, numbers[2]: "NA"},
    ]
    fields = predict.endpoint_fields(cloud, endpoint_id)
    assert fields == predictor.fields
    answer = predict.predict_endpoint(cloud, endpoint_id, predict.for_tf_serving(fields, written))
    assert all(set(r) == set(predictor.fields.kinds) for r in received)
    assert np.isnan(received[0][numbers[0]]) and np.isnan(received[2][numbers[2]])
    assert np.isnan(received[1][numbers[1]])
    assert received[1][texts[0]] == ""
    local = predictor.predict(written)
    np.testing.assert_allclose(
        [a["probabilities"] for a in answer], [p["probabilities"] for p in local], rtol=1e-6
    )


def test_an_endpoint_refusal_is_a_prediction_error_with_its_message(cloud_sdk, predictor):
    fake, cloud = cloud_sdk
    fake.predictor = predictor.predict
    endpoint_id = _deployed(cloud)
    with pytest.raises(predict.PredictionError, match=r"^400: .*instance 0.*'age'"):
        predict.predict_endpoint(cloud, endpoint_id, [{"age": "old"}])
    fake.problems.clear()  # the refusal was the point


def test_a_model_deployed_without_traffic_does_not_decide_the_fields(
    cloud_sdk, predictor, census_model, gcs
):
    """Only the models that take traffic meet an instance: one deployed at 0% (here with no
    model at its artifactUri at all) is not read."""
    from google.cloud import aiplatform

    _, cloud = cloud_sdk
    blob = gcs.bucket("test-bucket").blob("model/saved_model.pb")
    blob.upload_from_filename(f"{census_model}/saved_model.pb")
    endpoint_id = _deployed(cloud)
    idle = aiplatform.Model.upload(
        display_name="idle",
        artifact_uri="gs://test-bucket/no-model",
        serving_container_image_uri=publishing.SERVING_IMAGE,
    )
    endpoint = aiplatform.Endpoint(cloud.resource("endpoints", endpoint_id))
    endpoint.deploy(idle, traffic_percentage=0, machine_type="n1-standard-2")
    assert len(endpoint.list_models()) == 2
    assert predict.endpoint_fields(cloud, endpoint_id) == predictor.fields


def test_an_answer_without_predictions_is_a_prediction_error(tmp_path):
    import http.server
    import threading

    class NoPredictions(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"outputs": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NoPredictions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(predict.PredictionError, match='without predictions: {"outputs"'):
            predict.predict_at_url(url, [{"x": 1}])
    finally:
        server.shutdown()


def test_a_line_separator_inside_a_json_string_is_no_line_break(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": "a\u2028b"}\r\n{"x": "c\x85d"}\n', newline="")
    assert predict.read_instances(str(tmp_path / "a.jsonl")) == [{"x": "a\u2028b"}, {"x": "c\x85d"}]
