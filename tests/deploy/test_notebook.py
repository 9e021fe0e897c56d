"""examples/batch_prediction.ipynb runs top to bottom on a small census model and shows a
table and a plot."""

from __future__ import annotations

import pytest

from tests.support import REPO

NOTEBOOK = REPO / "examples" / "batch_prediction.ipynb"


@pytest.mark.slow  # starts a kernel, imports TensorFlow, predicts 16k rows: ~30 s on 2 cores
def test_notebook_runs_and_shows_a_table_and_a_plot(census_model, tmp_path, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv("ADANET_MODEL_DIR", census_model)
    monkeypatch.setenv("ADANET_BATCH_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},  # where Jupyter starts it
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert "16281 predictions, 0 errors" in text
    assert any(
        "text/html" in o.get("data", {}) and "p(&gt;50K)" in o["data"]["text/html"] for o in outputs
    ), "no table"
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot"
    assert list((tmp_path / "out").glob("prediction-census-*/prediction.results-00000-of-00001"))
