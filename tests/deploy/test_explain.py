"""Explanations without an endpoint (deploy/serving/explain.py): sampled Shapley attributions that
add up to the output's change from the baseline, exact on a model without interactions between
columns, and `deploy.serve`'s `/explain` answering in a Vertex endpoint's response shape."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import pytest

from deploy.batch_prediction import output
from deploy.cloud import api
from deploy.serving import explain
from deploy.serving.instances import Predictor
from deploy.serving.server import PredictionServer, Routes
from tests.deploy import discovery
from tests.support import FAST_FLAGS, make_data, run_task


@pytest.fixture(scope="module")
def additive_model(tmp_path_factory) -> str:
    """A regression whose prediction is a sum of one function per column (the linear
    generator: each column's encoding times its weights), on x1, x2 and color."""
    tmp = tmp_path_factory.mktemp("additive")
    data = make_data(tmp, "regression", n_train=1500, n_eval=200)
    job = tmp / "job"
    result = run_task(
        [
            f"--train_data={data.train}",
            "--label_column=target",
            f"--job_dir={job}",
            "--generator=linear",
            "--feature_importance_rows=0",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return str(job / "model")


INSTANCES: list[dict] = [
    {"x1": 1.2, "x2": -0.4, "color": "red"},
    {"x1": -2.0, "x2": 1.5, "color": "blue"},
    {"x1": 0.1, "x2": None, "color": "green"},  # a missing number, as serving takes it
]


def test_on_an_additive_model_each_attribution_is_its_columns_own_effect(additive_model):
    predictor = Predictor(additive_model)
    explainer = explain.Explainer.of(predictor, path_count=4)
    baseline = explainer.baseline
    assert set(baseline) == {"x1", "x2", "color"} and isinstance(baseline["color"], str)
    predictions, explanations = explainer.explain(predictor.check(INSTANCES))
    base = predictor.predict_checked([baseline])[0]["predictions"]
    for x, prediction, explanation in zip(INSTANCES, predictions, explanations):
        (attribution,) = explanation["attributions"]
        assert attribution["outputName"] == "predictions" and attribution["outputIndex"] == []
        assert attribution["instanceOutputValue"] == pytest.approx(prediction["predictions"])
        assert attribution["baselineOutputValue"] == pytest.approx(base)
        # Shapley values of an additive function: each column's effect alone, from the baseline
        for name, value in attribution["featureAttributions"].items():
            alone = predictor.predict_checked([{**baseline, name: x[name]}])[0]["predictions"]
            assert value == pytest.approx(alone - base, abs=1e-4), name
        assert attribution["approximationError"] < 1e-4  # every walk agrees
        total = sum(attribution["featureAttributions"].values())
        assert total == pytest.approx(prediction["predictions"] - base, abs=1e-4)


def test_attributions_add_up_to_the_change_from_the_baseline(predictor, census_rows):
    """The census model (calibrated, deciding at a threshold): a probability is not additive in
    the columns, so the walks disagree, but every walk adds up, and so do their means."""
    explainer = explain.Explainer.of(predictor, path_count=6)
    predictions, explanations = explainer.explain(predictor.check(census_rows[:8]))
    for prediction, explanation in zip(predictions, explanations):
        (attribution,) = explanation["attributions"]
        assert attribution["outputName"] == "probabilities"
        (index,) = attribution["outputIndex"]
        assert index == prediction["class_ids"]  # the class predicted, at the threshold
        assert attribution["outputDisplayName"] == prediction["classes"]
        assert attribution["instanceOutputValue"] == pytest.approx(
            prediction["probabilities"][index]
        )
        change = attribution["instanceOutputValue"] - attribution["baselineOutputValue"]
        assert sum(attribution["featureAttributions"].values()) == pytest.approx(change, abs=1e-5)
        assert set(attribution["featureAttributions"]) == set(census_rows[0])
        assert attribution["approximationError"] >= 0


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_the_server_explains_in_a_vertex_endpoints_response_shape(predictor, census_rows):
    explainer = explain.Explainer.of(predictor)
    server = PredictionServer(predictor, routes=Routes(port=0), explainer=explainer).start()
    try:
        request = {"instances": census_rows[:3]}
        assert discovery.validate(request, "GoogleCloudAiplatformV1ExplainRequest") == []
        status, answer = _post(server.url + "/explain", request)
        assert status == 200, answer
        assert discovery.validate_response(answer, "GoogleCloudAiplatformV1ExplainResponse") == []
        assert len(answer["explanations"]) == len(answer["predictions"]) == 3
        expected = predictor.predict(census_rows[:3])  # in batches of another size
        assert [p["classes"] for p in answer["predictions"]] == [e["classes"] for e in expected]
        for got, want in zip(answer["predictions"], expected):
            assert got["probabilities"] == pytest.approx(want["probabilities"], abs=1e-6)
        assert answer["explanations"] == explainer.explain(predictor.check(census_rows[:3]))[1]
        status, answer = _post(server.url + "/explain", {"instances": [{"age": "x"}]})
        assert status == 400 and "age" in answer["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_model_without_a_baseline_says_how_to_get_one(census_model, tmp_path):
    old = tmp_path / "model"
    shutil.copytree(census_model, old)
    (old / explain.BASELINE).unlink()
    predictor = Predictor(str(old))
    with pytest.raises(api.DeployError, match="export it again"):
        explain.Explainer.of(predictor)
    server = PredictionServer(predictor, routes=Routes(port=0)).start()
    try:
        status, answer = _post(server.url + "/explain", {"instances": []})
        assert status == 400 and "explanation_baseline.json" in answer["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_batch_prediction_writes_each_rows_explanation_beside_its_key(
    predictor, census_rows, tmp_path
):
    import csv

    from deploy.batch_prediction import local as batch_local

    path = tmp_path / "in.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", *census_rows[0]])
        writer.writerows([[f"r{i}", *row.values()] for i, row in enumerate(census_rows[:40])])
    result = batch_local.predict_local(
        model_dir="",
        sources=[str(path)],
        predictor=predictor,
        output_prefix=str(tmp_path / "out"),
        instances_format="csv",
        key_field="id",
        explain_path_count=3,
    )
    results, errors = output.read_results(result.output_dir)
    assert errors == [] and [r["key"] for r in results] == [f"r{i}" for i in range(40)]
    explainer = explain.Explainer.of(predictor, path_count=3)
    _, expected = explainer.explain(predictor.check(census_rows[:32]))  # the first batch
    assert [r["explanation"] for r in results[:32]] == expected
    for line in results:
        (attribution,) = line["explanation"]["attributions"]
        change = attribution["instanceOutputValue"] - attribution["baselineOutputValue"]
        assert sum(attribution["featureAttributions"].values()) == pytest.approx(change, abs=1e-5)
        assert attribution["outputDisplayName"] == line["prediction"]["classes"]
