"""The search never selects on the rows it reports as test: with --eval_data and selection on
held-out rows, it holds out --holdout_fraction of the training rows to choose on, and the eval
data is scored once, by the exported model."""

from __future__ import annotations

from tests.support import FAST_FLAGS, load_report, run_task


def _run(binary_data, job_dir, *flags, eval_data=True):
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            *([f"--eval_data={binary_data.eval}"] if eval_data else []),
            "--label_column=target",
            f"--job_dir={job_dir}",
            *FAST_FLAGS,
            *flags,
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return load_report(job_dir), result.stdout


def test_selection_on_held_out_rows_holds_them_out_of_the_training_data(binary_data, tmp_path):
    report, stdout = _run(binary_data, tmp_path / "job", "--selection=holdout")
    held_out = report["input"]["training_rows"]
    # 2,000 training rows: about 10% held out to choose on, the 500 eval rows never.
    assert {r["eval_examples"] for r in report["iterations"]} == {2000 - held_out}
    assert 150 < 2000 - held_out < 250
    assert report["final"]["examples"] == 500
    assert report["final"]["eval_data"] == str(binary_data.eval)
    assert f"exported model on {binary_data.eval} (500 examples)" in stdout


def test_other_selections_train_on_every_row_and_show_the_eval_data(binary_data, tmp_path):
    report, _ = _run(binary_data, tmp_path / "job", "--selection=moving_average")
    assert report["input"]["training_rows"] == 2000
    assert {r["eval_examples"] for r in report["iterations"]} == {500}


def test_without_eval_data_the_final_figure_says_it_is_a_selection_score(binary_data, tmp_path):
    _, stdout = _run(binary_data, tmp_path / "job", "--selection=holdout", eval_data=False)
    assert (
        "exported model on 10% of the training rows held out, which the search chose on (a "
        "selection score, not a test score: give --eval_data for one)" in stdout
    )
