"""The notebooks in examples/ run top to bottom, from their own folder, as Jupyter runs them:
batch_prediction.ipynb on a small census model (a table and a plot), notebook_api.ipynb
training its own through `deploy.sdk` (its report, a keyed batch prediction and one row's
attributions as a bar chart)."""

from __future__ import annotations

import pytest

from tests.support import REPO

NOTEBOOK = REPO / "examples" / "batch_prediction.ipynb"
API_NOTEBOOK = REPO / "examples" / "notebook_api.ipynb"


def _execute(path):
    """The notebook at `path`, run from its folder (where Jupyter starts the kernel); its
    code cells' outputs."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]


@pytest.mark.slow  # starts a kernel, imports TensorFlow, predicts 16k rows: ~30 s on 2 cores
def test_notebook_runs_and_shows_a_table_and_a_plot(census_model, tmp_path, monkeypatch):
    monkeypatch.setenv("ADANET_MODEL_DIR", census_model)
    monkeypatch.setenv("ADANET_BATCH_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    outputs = _execute(NOTEBOOK)
    text = "".join(o.get("text", "") for o in outputs)
    assert "16281 predictions, 0 errors" in text
    assert any(
        "text/html" in o.get("data", {}) and "p(&gt;50K)" in o["data"]["text/html"] for o in outputs
    ), "no table"
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot"
    assert list((tmp_path / "out").glob("prediction-census-*/prediction.results-00000-of-00001"))


@pytest.mark.slow  # trains a census model (one iteration) and explains a row: ~60 s on 2 cores
def test_api_notebook_trains_batch_predicts_with_keys_and_explains(tmp_path, monkeypatch):
    import json

    job_dir = tmp_path / "job"
    monkeypatch.setenv("ADANET_NOTEBOOK_JOB_DIR", str(job_dir))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    outputs = _execute(API_NOTEBOOK)
    text = "".join(o.get("text", "") for o in outputs)
    assert "Exported the chosen ensemble" in text, "the trainer's log is not in the cell"
    assert "2000 predictions, 0 errors" in text
    assert "accuracy 0.8" in text and "on 2000 rows joined by key" in text
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("eval accuracy" in h for h in html), "no report table"
    assert any("person-00000" in h for h in html), "no keyed predictions table"
    assert any("image/png" in o.get("data", {}) for o in outputs), "no bar chart"
    # the attributions printed sum to the output's change from the baseline
    line = next(x for x in text.splitlines() if "attributions sum to" in x)
    numbers = [float(w.strip(",()")) for w in line.replace("+", "").split() if _is_number(w)]
    baseline, instance, total = numbers[:3]
    assert abs(instance - baseline - total) < 0.002, line
    report = json.loads((job_dir / "report.json").read_text())
    assert report["status"] == "complete"


def _is_number(word: str) -> bool:
    try:
        float(word.strip(",()").replace("+", ""))
        return True
    except ValueError:
        return False
