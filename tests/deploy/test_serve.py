"""deploy.serve: Vertex's custom-container contract, input checks, and robustness."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from deploy import predict, serve
from tests.deploy.conftest import free_port
from tests.support import REPO, task_env


@pytest.fixture(scope="module")
def server(predictor):
    server = serve.PredictionServer(predictor, routes=serve.Routes(port=0)).start()
    yield server
    server.shutdown()
    server.server_close()


def _post(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_predictions_match_the_model_and_have_every_output(server, predictor, census_rows):
    predictions = predict.predict_at_url(server.url, census_rows[:5])
    assert predictions == predictor.predict(census_rows[:5])
    assert set(predictions[0]) == {"probabilities", "class_ids", "classes", "logits"}
    assert predictions[0]["classes"] in ("<=50K", ">50K")
    assert sum(predictions[0]["probabilities"]) == pytest.approx(1.0, abs=1e-5)


def test_binds_to_loopback_and_answers_health(server):
    assert server.server_address[0] == "127.0.0.1"
    with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x: x.update(colour="red"), "instance 1: unknown field 'colour'"),
        (lambda x: x.pop("age"), "instance 1: missing field 'age'"),
        (lambda x: x.update(age="old"), "instance 1: field 'age' must be a number, got 'old'"),
        (lambda x: x.update(sex=1), "instance 1: field 'sex' must be a string, got 1"),
    ],
)
def test_malformed_instances_get_a_400_naming_the_field(server, census_rows, change, message):
    bad = dict(census_rows[1])
    change(bad)
    with pytest.raises(predict.PredictionError, match="400: " + message):
        predict.predict_at_url(server.url, [census_rows[0], bad])
    assert len(predict.predict_at_url(server.url, census_rows[:2])) == 2  # still serving


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "not JSON"),
        (b'{"rows": []}', '{"instances": [...]}'),
        (b'{"instances": {}}', "'instances' must be a list"),
        (b'{"instances": [[1, 2]]}', "instance 0: is a list, expected an object"),
    ],
)
def test_malformed_bodies_get_a_400(server, body, message):
    status, answer = _post(server.url + "/predict", body)
    assert status == 400 and message in answer["error"]


def test_requests_over_1_5_mb_are_refused_and_the_server_keeps_serving(server, census_rows):
    big = json.dumps({"instances": census_rows * 200}).encode()
    assert len(big) > serve.MAX_REQUEST_BYTES
    status, answer = _post(server.url + "/predict", big)
    assert status == 400 and "limit is 1572864 (1.5 MB)" in answer["error"]
    assert len(predict.predict_at_url(server.url, census_rows[:3])) == 3


def test_unknown_routes_get_a_404(server):
    status, answer = _post(server.url + "/v1/models/x:predict", b'{"instances": []}')
    assert status == 404 and "/predict" in answer["error"]


def test_routes_come_from_the_aip_variables():
    routes = serve.Routes.from_env(
        {"AIP_HTTP_PORT": "9000", "AIP_HEALTH_ROUTE": "/h", "AIP_PREDICT_ROUTE": "/v1/p"}
    )
    assert routes == serve.Routes(9000, "/h", "/v1/p")
    assert serve.Routes.from_env({}) == serve.Routes(8080, "/health", "/predict")
    with pytest.raises(ValueError, match="AIP_HTTP_PORT"):
        serve.Routes.from_env({"AIP_HTTP_PORT": "http"})


@pytest.mark.slow  # a fresh process imports TensorFlow and loads the model: ~10 s on 2 cores
def test_the_command_serves_the_vertex_contract(census_model, census_rows):
    port = free_port()
    env = {
        **task_env(),
        "AIP_HTTP_PORT": str(port),
        "AIP_HEALTH_ROUTE": "/ping",
        "AIP_PREDICT_ROUTE": "/v1/predict",
        "AIP_STORAGE_URI": census_model,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "deploy.serve"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url + "/ping", process)
        answer = predict.predict_at_url(url, census_rows[:2], route="/v1/predict")
        assert len(answer) == 2 and "probabilities" in answer[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_healthy(url: str, process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(process.stdout.read().decode()[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {timeout} s")
